//! The transactional outbox on a real SQLite file: a message exists
//! exactly when the producer's transaction commits, is sent once it is
//! due, deleted once confirmed, taken by one of several dispatchers (each
//! with a connection of its own) at a time, and sent again (same id) when
//! its dispatcher died or its broker was away.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::outbox::{MemorySender, Message};
use idem_sqlite::outbox::{Outbox, OutboxError};
use rusqlite::{Connection, TransactionBehavior};

/// A connection to `path` as a producer or dispatcher opens one: WAL, and
/// waiting for the write lock rather than failing at once.
fn open(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("WAL");
    conn
}

/// A fresh database with the outbox and an `orders` table, and a short
/// lease.
fn setup() -> (Outbox, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let outbox = Outbox::new().lease(Duration::from_millis(500));
    let conn = open(&path);
    outbox.setup(&conn).expect("setup");
    conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .expect("orders");
    (outbox, dir, path)
}

/// Places order `id` and enqueues its message in one transaction,
/// committed or rolled back.
fn place(outbox: &Outbox, conn: &mut Connection, id: i64, commit: bool) {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("begin");
    tx.execute("INSERT INTO orders VALUES (?1)", [id])
        .expect("order");
    let message =
        Message::new("order-events", format!("placed {id}")).header("order", id.to_string());
    outbox.enqueue(&tx, &message).expect("enqueue");
    if commit {
        tx.commit().expect("commit");
    } else {
        tx.rollback().expect("rollback");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_exists_exactly_when_its_transaction_commits() {
    let (outbox, _dir, path) = setup();
    let mut c = open(&path);
    place(&outbox, &mut c, 1, false);
    place(&outbox, &mut c, 2, true);
    let conn = Mutex::new(c);
    let sender = MemorySender::new();
    let pass = outbox.dispatch(&conn, &sender, 10).await.expect("dispatch");
    assert_eq!((pass.taken, pass.sent, pass.failed), (1, 1, false));
    let sent = sender.messages();
    assert_eq!(sent[0].payload().as_ref(), b"placed 2");
    assert_eq!(sent[0].headers(), [("order".to_owned(), "2".to_owned())]);
    let again = outbox.dispatch(&conn, &sender, 10).await.expect("dispatch");
    assert_eq!(again.taken, 0, "a confirmed message stays deleted");
    let left: i64 = conn
        .lock()
        .expect("lock")
        .query_row("SELECT count(*) FROM idem_outbox", [], |r| r.get(0))
        .expect("count");
    assert_eq!(left, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_dispatchers_send_each_message_once() {
    const MESSAGES: i64 = 200;
    let (outbox, _dir, path) = setup();
    let mut c = open(&path);
    for id in 0..MESSAGES {
        place(&outbox, &mut c, id, true);
    }
    let sender = MemorySender::new();
    let dispatchers = (0..4).map(|_| {
        let (outbox, sender) = (outbox.clone(), sender.clone());
        let conn = Arc::new(Mutex::new(open(&path)));
        tokio::spawn(async move {
            while outbox
                .dispatch(&conn, &sender, 16)
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
    let (outbox, _dir, path) = setup();
    let mut c = open(&path);
    place(&outbox, &mut c, 1, true);
    place(&outbox, &mut c, 2, true);
    let conn = Mutex::new(c);
    let sender = MemorySender::new();
    sender.hang(true);
    let killed = tokio::time::timeout(
        Duration::from_millis(200),
        outbox.dispatch(&conn, &sender, 10),
    )
    .await;
    assert!(killed.is_err(), "the hung dispatch was cut off");
    sender.hang(false);
    let early = outbox.dispatch(&conn, &sender, 10).await.expect("dispatch");
    assert_eq!(
        early.taken, 0,
        "taken rows are not due before the lease ends"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    sender.fail(true);
    let down = outbox.dispatch(&conn, &sender, 10).await.expect("dispatch");
    assert_eq!((down.taken, down.sent, down.failed), (2, 0, true));
    tokio::time::sleep(Duration::from_millis(600)).await;
    sender.fail(false);
    let pass = outbox.dispatch(&conn, &sender, 10).await.expect("dispatch");
    assert_eq!((pass.taken, pass.sent), (2, 2));
    let payloads: Vec<_> = sender
        .messages()
        .iter()
        .map(|m| m.payload().clone())
        .collect();
    assert_eq!(payloads, ["placed 1", "placed 2"], "in the order enqueued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_not_set_up_or_outside_a_transaction_says_so() {
    let outbox = Outbox::new();
    let conn = Connection::open_in_memory().expect("open");
    let message = Message::new("d", "p");
    assert!(matches!(
        outbox.enqueue(&conn, &message),
        Err(OutboxError::NotInTransaction)
    ));
    let conn = Mutex::new(conn);
    let missing = outbox.dispatch(&conn, &MemorySender::new(), 1).await;
    assert!(
        matches!(missing, Err(OutboxError::NotSetUp(_))),
        "{missing:?}"
    );
}
