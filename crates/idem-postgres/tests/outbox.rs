//! The transactional outbox against a real PostgreSQL: a message exists
//! exactly when the producer's transaction commits, is sent once it is
//! due, deleted once confirmed, taken by one of several dispatchers at a
//! time, sent again (same id) when its dispatcher died or its broker
//! was away, and the dispatcher loop is woken by a producer's commit.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use idem::outbox::{MemorySender, Message};
use idem_postgres::outbox::{Outbox, OutboxError};
use idem_postgres::PgStore;
use tokio_postgres::Client;

use common::{client, url};

/// An outbox in a fresh schema, with an `orders` table, and a short lease.
async fn setup() -> (Outbox, String, Client) {
    let schema = format!("outbox_{:016x}", rand::random::<u64>());
    let outbox = Outbox::in_schema(&schema).lease(Duration::from_millis(500));
    let mut c = client().await;
    outbox.setup(&mut c).await.expect("setup");
    c.batch_execute(&format!(
        "CREATE TABLE {schema}.orders (id bigint PRIMARY KEY)"
    ))
    .await
    .expect("orders");
    (outbox, schema, c)
}

/// Places order `id` and enqueues its message in one transaction,
/// committed or rolled back.
async fn place(outbox: &Outbox, schema: &str, c: &mut Client, id: i64, commit: bool) {
    let tx = c.transaction().await.expect("begin");
    tx.execute(&format!("INSERT INTO {schema}.orders VALUES ($1)"), &[&id])
        .await
        .expect("order");
    let message =
        Message::new("order-events", format!("placed {id}")).header("order", id.to_string());
    outbox.enqueue(&tx, &message).await.expect("enqueue");
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_exists_exactly_when_its_transaction_commits() {
    let (outbox, schema, mut c) = setup().await;
    place(&outbox, &schema, &mut c, 1, false).await;
    place(&outbox, &schema, &mut c, 2, true).await;
    let sender = MemorySender::new();
    let pass = outbox.dispatch(&c, &sender, 10).await.expect("dispatch");
    assert_eq!((pass.taken, pass.sent, pass.failed), (1, 1, false));
    let sent = sender.messages();
    assert_eq!(sent[0].payload().as_ref(), b"placed 2");
    assert_eq!(sent[0].headers(), [("order".to_owned(), "2".to_owned())]);
    let again = outbox.dispatch(&c, &sender, 10).await.expect("dispatch");
    assert_eq!(again.taken, 0, "a confirmed message stays deleted");
    let left: i64 = c
        .query_one(&format!("SELECT count(*) FROM {schema}.idem_outbox"), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dispatchers_send_each_message_once_in_order() {
    const MESSAGES: i64 = 200;
    let (outbox, schema, mut c) = setup().await;
    for id in 0..MESSAGES {
        place(&outbox, &schema, &mut c, id, true).await;
    }
    let sender = MemorySender::new();
    let dispatchers = (0..4).map(|_| {
        let (outbox, sender) = (outbox.clone(), sender.clone());
        tokio::spawn(async move {
            let c = client().await;
            while outbox
                .dispatch(&c, &sender, 16)
                .await
                .expect("dispatch")
                .taken
                > 0
            {}
        })
    });
    for dispatcher in dispatchers.collect::<Vec<_>>() {
        dispatcher.await.expect("joined");
    }
    let sent = sender.messages();
    let ids: HashSet<_> = sent.iter().map(Message::id).collect();
    assert_eq!(sent.len(), MESSAGES as usize, "sent once each");
    assert_eq!(ids.len(), sent.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_dispatcher_or_an_absent_broker_leaves_messages_due_again() {
    let (outbox, schema, mut c) = setup().await;
    place(&outbox, &schema, &mut c, 1, true).await;
    place(&outbox, &schema, &mut c, 2, true).await;
    let sender = MemorySender::new();
    sender.hang(true);
    let killed =
        tokio::time::timeout(Duration::from_millis(200), outbox.dispatch(&c, &sender, 10)).await;
    assert!(killed.is_err(), "the hung dispatch was cut off");
    sender.hang(false);
    let early = outbox.dispatch(&c, &sender, 10).await.expect("dispatch");
    assert_eq!(
        early.taken, 0,
        "taken rows are not due before the lease ends"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    sender.fail(true);
    let down = outbox.dispatch(&c, &sender, 10).await.expect("dispatch");
    assert_eq!((down.taken, down.sent, down.failed), (2, 0, true));
    tokio::time::sleep(Duration::from_millis(600)).await;
    sender.fail(false);
    let pass = outbox.dispatch(&c, &sender, 10).await.expect("dispatch");
    assert_eq!((pass.taken, pass.sent), (2, 2));
    let payloads: Vec<_> = sender
        .messages()
        .iter()
        .map(|m| m.payload().clone())
        .collect();
    assert_eq!(payloads, ["placed 1", "placed 2"], "in the order enqueued");
}

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
