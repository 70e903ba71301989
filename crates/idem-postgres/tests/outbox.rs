//! The transactional outbox against a real PostgreSQL: the shared cases
//! of every standalone outbox (`idem_testkit::conformance::outbox_table`:
//! a message exists exactly when the producer's transaction commits, is
//! taken by one of several dispatchers, comes due again after a dead
//! dispatcher or an absent broker), and PostgreSQL's own: the dispatcher
//! loop woken by a producer's commit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem::outbox::{MemorySender, Message, OutboxPass};
use idem_postgres::outbox::{Outbox, OutboxError};
use idem_postgres::PgStore;
use idem_testkit::conformance::outbox_table::{OutboxTable, LEASE};
use tokio_postgres::Client;

use common::{client, url};

/// An outbox in a fresh schema, with an `orders` table, and a short lease.
async fn setup() -> (Outbox, String, Client) {
    let schema = format!("outbox_{:016x}", rand::random::<u64>());
    let outbox = Outbox::in_schema(&schema).lease(LEASE);
    let mut c = client().await;
    outbox.setup(&mut c).await.expect("setup");
    c.batch_execute(&format!(
        "CREATE TABLE {schema}.orders (id bigint PRIMARY KEY)"
    ))
    .await
    .expect("orders");
    (outbox, schema, c)
}

/// Places order `id` and enqueues `message` in one transaction,
/// committed or rolled back.
async fn place_with(
    outbox: &Outbox,
    schema: &str,
    c: &mut Client,
    id: i64,
    message: &Message,
    commit: bool,
) {
    let tx = c.transaction().await.expect("begin");
    tx.execute(&format!("INSERT INTO {schema}.orders VALUES ($1)"), &[&id])
        .await
        .expect("order");
    outbox.enqueue(&tx, message).await.expect("enqueue");
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
}

/// Places order `id` with its `placed {id}` message.
async fn place(outbox: &Outbox, schema: &str, c: &mut Client, id: i64, commit: bool) {
    let message = Message::new("order-events", format!("placed {id}"));
    place_with(outbox, schema, c, id, &message, commit).await;
}

/// The outbox of a fresh schema, each dispatcher with a client of its own.
struct Table {
    outbox: Outbox,
    schema: String,
    client: Arc<tokio::sync::Mutex<Client>>,
}

async fn table() -> Table {
    let (outbox, schema, client) = setup().await;
    Table {
        outbox,
        schema,
        client: Arc::new(tokio::sync::Mutex::new(client)),
    }
}

impl OutboxTable for Table {
    async fn place(&self, id: i64, message: Message, commit: bool) {
        let mut c = self.client.lock().await;
        place_with(&self.outbox, &self.schema, &mut c, id, &message, commit).await;
    }

    async fn dispatch(&self, sender: &MemorySender, batch: usize) -> OutboxPass {
        let c = self.client.lock().await;
        self.outbox
            .dispatch(&c, sender, batch)
            .await
            .expect("dispatch")
    }

    async fn another(&self) -> Self {
        Table {
            outbox: self.outbox.clone(),
            schema: self.schema.clone(),
            client: Arc::new(tokio::sync::Mutex::new(client().await)),
        }
    }

    async fn rows(&self) -> i64 {
        let c = self.client.lock().await;
        c.query_one(
            &format!("SELECT count(*) FROM {}.idem_outbox", self.schema),
            &[],
        )
        .await
        .expect("count")
        .get(0)
    }
}

idem_testkit::outbox_table_suite!(table);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_not_set_up_says_so() {
    let schema = format!("outbox_{:016x}", rand::random::<u64>());
    let outbox = Outbox::in_schema(&schema);
    let c = client().await;
    let missing = outbox.dispatch(&c, &MemorySender::new(), 1).await;
    assert!(
        matches!(missing, Err(OutboxError::NotSetUp { ref table }) if table.ends_with(".idem_outbox")),
        "{missing:?}"
    );
}

/// Runs `outbox`'s dispatcher on a store at `url` in `schema`, looking
/// every `every`, until the returned task is aborted.
async fn run(
    outbox: &Outbox,
    url: &str,
    schema: &str,
    sender: &MemorySender,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let store = PgStore::builder(url)
        .expect("valid URL")
        .schema(schema)
        .connect()
        .await
        .expect("connect");
    let (outbox, sender) = (outbox.clone(), sender.clone());
    tokio::spawn(async move { outbox.run(&store, &sender, 16, every).await })
}

/// Waits (ten seconds at most) until `sender` holds `n` messages.
async fn sent(sender: &MemorySender, n: usize) {
    let started = tokio::time::Instant::now();
    while sender.messages().len() < n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} of {n} messages sent",
            sender.messages().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_is_woken_by_a_commit_that_enqueued() {
    let (outbox, schema, mut c) = setup().await;
    let sender = MemorySender::new();
    // It would look only once a minute: what it sends sooner, it was
    // woken for.
    let dispatcher = run(&outbox, &url(), &schema, &sender, Duration::from_secs(60)).await;
    for round in 1..=3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        place(&outbox, &schema, &mut c, 100 + round, false).await;
        place(&outbox, &schema, &mut c, round, true).await;
        sent(&sender, round as usize).await;
    }
    dispatcher.abort();
    let payloads: Vec<_> = sender
        .messages()
        .iter()
        .map(|m| m.payload().clone())
        .collect();
    assert_eq!(
        payloads,
        ["placed 1", "placed 2", "placed 3"],
        "a rolled-back enqueue is never sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_that_cannot_listen_looks_every_interval() {
    let (outbox, schema, mut c) = setup().await;
    let sender = MemorySender::new();
    let url = format!("{}?listen=false", url());
    let dispatcher = run(&outbox, &url, &schema, &sender, Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    place(&outbox, &schema, &mut c, 1, true).await;
    sent(&sender, 1).await;
    // A message whose send failed comes due again after the lease (500 ms)
    // and is found by a look, with no enqueue to wake anyone.
    sender.fail(true);
    place(&outbox, &schema, &mut c, 2, true).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    sender.fail(false);
    sent(&sender, 2).await;
    dispatcher.abort();
    assert_eq!(sender.messages()[1].payload().as_ref(), b"placed 2");
}
