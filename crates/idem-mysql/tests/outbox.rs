//! The transactional outbox against a real MariaDB: a message exists
//! exactly when the producer's transaction commits, is sent once it is
//! due, deleted once confirmed, taken by one of several dispatchers at a
//! time, and sent again (same id) when its dispatcher died or its broker
//! was away.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use idem::outbox::{MemorySender, Message};
use idem_mysql::outbox::{Outbox, OutboxError};
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, TxOpts};

/// A pool on a new database with the outbox and an `orders` table, and a
/// short lease.
async fn setup() -> (Pool, Outbox) {
    let pool = Pool::new(common::url("outbox").as_str());
    let outbox = Outbox::new().lease(Duration::from_millis(500));
    let mut conn = pool.get_conn().await.expect("connect");
    outbox.setup(&mut conn).await.expect("setup");
    conn.query_drop("CREATE TABLE orders (id BIGINT PRIMARY KEY)")
        .await
        .expect("orders");
    (pool, outbox)
}

/// Places order `id` and enqueues its message in one transaction,
/// committed or rolled back.
async fn place(pool: &Pool, outbox: &Outbox, id: i64, commit: bool) {
    let mut conn = pool.get_conn().await.expect("connect");
    let mut tx = conn
        .start_transaction(TxOpts::default())
        .await
        .expect("begin");
    tx.exec_drop("INSERT INTO orders VALUES (?)", (id,))
        .await
        .expect("order");
    let message =
        Message::new("order-events", format!("placed {id}")).header("order", id.to_string());
    outbox.enqueue(&mut tx, &message).await.expect("enqueue");
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
}

async fn rows_left(pool: &Pool) -> i64 {
    let mut conn = pool.get_conn().await.expect("connect");
    conn.query_first("SELECT count(*) FROM idem_outbox")
        .await
        .expect("count")
        .expect("a row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_exists_exactly_when_its_transaction_commits() {
    let (pool, outbox) = setup().await;
    place(&pool, &outbox, 1, false).await;
    place(&pool, &outbox, 2, true).await;
    let sender = MemorySender::new();
    let pass = outbox.dispatch(&pool, &sender, 10).await.expect("dispatch");
    assert_eq!((pass.taken, pass.sent, pass.failed), (1, 1, false));
    let sent = sender.messages();
    assert_eq!(sent[0].payload().as_ref(), b"placed 2");
    assert_eq!(sent[0].headers(), [("order".to_owned(), "2".to_owned())]);
    let again = outbox.dispatch(&pool, &sender, 10).await.expect("dispatch");
    assert_eq!(again.taken, 0, "a confirmed message stays deleted");
    assert_eq!(rows_left(&pool).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dispatchers_send_each_message_once() {
    const MESSAGES: i64 = 200;
    let (pool, outbox) = setup().await;
    for id in 0..MESSAGES {
        place(&pool, &outbox, id, true).await;
    }
    let sender = MemorySender::new();
    let dispatchers = (0..4).map(|_| {
        let (outbox, sender, pool) = (outbox.clone(), sender.clone(), pool.clone());
        tokio::spawn(async move {
            while outbox
                .dispatch(&pool, &sender, 16)
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
    assert_eq!(rows_left(&pool).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_dispatcher_or_an_absent_broker_leaves_messages_due_again() {
    let (pool, outbox) = setup().await;
    place(&pool, &outbox, 1, true).await;
    place(&pool, &outbox, 2, true).await;
    let sender = MemorySender::new();
    sender.hang(true);
    let killed = tokio::time::timeout(
        Duration::from_millis(300),
        outbox.dispatch(&pool, &sender, 10),
    )
    .await;
    assert!(killed.is_err(), "the hung dispatch was cut off");
    sender.hang(false);
    let early = outbox.dispatch(&pool, &sender, 10).await.expect("dispatch");
    assert_eq!(
        early.taken, 0,
        "taken rows are not due before the lease ends"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    sender.fail(true);
    let down = outbox.dispatch(&pool, &sender, 10).await.expect("dispatch");
    assert_eq!((down.taken, down.sent, down.failed), (2, 0, true));
    tokio::time::sleep(Duration::from_millis(600)).await;
    sender.fail(false);
    let pass = outbox
        .dispatch_due(&pool, &sender, 1)
        .await
        .expect("dispatch");
    assert_eq!((pass.taken, pass.sent, pass.failed), (2, 2, false));
    let payloads: Vec<_> = sender
        .messages()
        .iter()
        .map(|m| m.payload().clone())
        .collect();
    assert_eq!(payloads, ["placed 1", "placed 2"], "in the order enqueued");
    assert_eq!(rows_left(&pool).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_that_fails_mid_batch_keeps_the_rest_and_their_order() {
    let (pool, outbox) = setup().await;
    for id in 1..=3 {
        place(&pool, &outbox, id, true).await;
    }
    let sender = MemorySender::new();
    let first = outbox.dispatch(&pool, &sender, 1).await.expect("dispatch");
    assert_eq!((first.taken, first.sent), (1, 1));
    sender.fail(true);
    let down = outbox.dispatch(&pool, &sender, 10).await.expect("dispatch");
    assert_eq!((down.taken, down.sent, down.failed), (2, 0, true));
    assert_eq!(rows_left(&pool).await, 2, "only the confirmed row is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_not_set_up_says_so() {
    let pool = Pool::new(common::url("outbox_missing").as_str());
    let missing = Outbox::new().dispatch(&pool, &MemorySender::new(), 1).await;
    assert!(matches!(missing, Err(OutboxError::NotSetUp)), "{missing:?}");
}
