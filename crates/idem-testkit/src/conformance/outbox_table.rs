//! What every standalone transactional outbox must do (PostgreSQL's,
//! MySQL's, SQLite's), against its real database: a message exists
//! exactly when the producer's transaction commits, is sent once it is
//! due and deleted once confirmed, is taken by one of several dispatchers
//! (each with a connection of its own) at a time, comes due again under
//! the same id when its dispatcher died or its broker was away, and keeps
//! its place in the order when a send fails mid-batch.
//!
//! Each crate's `tests/outbox.rs` implements [`OutboxTable`] for its
//! outbox and runs the cases with [`outbox_table_suite!`](crate::outbox_table_suite).

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use idem::outbox::{MemorySender, Message, OutboxPass};

/// The dispatch lease a fixture's outbox is made with: short, so rows a
/// dispatcher took come due again within a test.
pub const LEASE: Duration = Duration::from_millis(500);

/// A standalone outbox in a fresh database (schema, file) of its own,
/// with an `orders (id)` table beside it and a [`LEASE`] of 500 ms.
pub trait OutboxTable: Send + Sync + Sized + 'static {
    /// Inserts order `id` and enqueues `message` in one transaction,
    /// committed or rolled back.
    fn place(&self, id: i64, message: Message, commit: bool) -> impl Future<Output = ()> + Send;
    /// One dispatch pass of up to `batch` messages through `sender`.
    fn dispatch(
        &self,
        sender: &MemorySender,
        batch: usize,
    ) -> impl Future<Output = OutboxPass> + Send;
    /// Another dispatcher on the same table, with a connection of its own.
    fn another(&self) -> impl Future<Output = Self> + Send;
    /// The rows left in the table.
    fn rows(&self) -> impl Future<Output = i64> + Send;
}

/// Order `id`'s message.
fn placed(id: i64) -> Message {
    Message::new("order-events", format!("placed {id}")).header("order", id.to_string())
}

/// A rolled-back transaction leaves no message; a committed one leaves
/// one, sent with its headers and then deleted.
pub async fn a_message_exists_exactly_when_its_transaction_commits(table: &impl OutboxTable) {
    table.place(1, placed(1), false).await;
    table.place(2, placed(2), true).await;
    let sender = MemorySender::new();
    let pass = table.dispatch(&sender, 10).await;
    assert_eq!((pass.taken, pass.sent, pass.failed), (1, 1, false));
    let sent = sender.messages();
    assert_eq!(sent[0].payload().as_ref(), b"placed 2");
    assert_eq!(sent[0].headers(), [("order".to_owned(), "2".to_owned())]);
    let again = table.dispatch(&sender, 10).await;
    assert_eq!(again.taken, 0, "a confirmed message stays deleted");
    assert_eq!(table.rows().await, 0);
}

/// Four dispatchers on one table send each of 200 messages once.
pub async fn concurrent_dispatchers_send_each_message_once<T: OutboxTable>(table: &T) {
    const MESSAGES: i64 = 200;
    for id in 0..MESSAGES {
        table.place(id, placed(id), true).await;
    }
    let sender = MemorySender::new();
    let mut dispatchers = Vec::new();
    for _ in 0..4 {
        let (dispatcher, sender) = (table.another().await, sender.clone());
        dispatchers.push(tokio::spawn(async move {
            while dispatcher.dispatch(&sender, 16).await.taken > 0 {}
        }));
    }
    for dispatcher in dispatchers {
        dispatcher.await.expect("a dispatcher panicked");
    }
    let sent = sender.messages();
    let ids: HashSet<_> = sent.iter().map(Message::id).collect();
    assert_eq!(sent.len(), MESSAGES as usize, "sent once each");
    assert_eq!(ids.len(), sent.len());
    assert_eq!(table.rows().await, 0);
}

/// Rows a dispatcher took and never confirmed (it was cut off while
/// sending, or the broker refused) come due again after the lease, in the
/// order they were enqueued.
pub async fn a_dead_dispatcher_or_an_absent_broker_leaves_messages_due_again(
    table: &impl OutboxTable,
) {
    table.place(1, placed(1), true).await;
    table.place(2, placed(2), true).await;
    let sender = MemorySender::new();
    sender.hang(true);
    let killed = tokio::time::timeout(Duration::from_millis(300), table.dispatch(&sender, 10));
    assert!(killed.await.is_err(), "the hung dispatch was cut off");
    sender.hang(false);
    let early = table.dispatch(&sender, 10).await;
    assert_eq!(
        early.taken, 0,
        "taken rows are not due before the lease ends"
    );
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    sender.fail(true);
    let down = table.dispatch(&sender, 10).await;
    assert_eq!((down.taken, down.sent, down.failed), (2, 0, true));
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    sender.fail(false);
    let pass = table.dispatch(&sender, 10).await;
    assert_eq!((pass.taken, pass.sent, pass.failed), (2, 2, false));
    let payloads: Vec<_> = sender
        .messages()
        .iter()
        .map(|m| m.payload().clone())
        .collect();
    assert_eq!(payloads, ["placed 1", "placed 2"], "in the order enqueued");
    assert_eq!(table.rows().await, 0);
}

/// A send that fails stops the batch: only the confirmed rows are
/// deleted, and the rest come due again first, in order.
pub async fn a_send_that_fails_mid_batch_keeps_the_rest_and_their_order(table: &impl OutboxTable) {
    for id in 1..=3 {
        table.place(id, placed(id), true).await;
    }
    let sender = MemorySender::new();
    let first = table.dispatch(&sender, 1).await;
    assert_eq!((first.taken, first.sent), (1, 1));
    sender.fail(true);
    let down = table.dispatch(&sender, 10).await;
    assert_eq!((down.taken, down.sent, down.failed), (2, 0, true));
    assert_eq!(table.rows().await, 2, "only the confirmed row is gone");
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    sender.fail(false);
    let rest = table.dispatch(&sender, 10).await;
    assert_eq!((rest.taken, rest.sent), (2, 2));
    let payloads: Vec<_> = sender
        .messages()
        .iter()
        .map(|m| m.payload().clone())
        .collect();
    assert_eq!(payloads, ["placed 1", "placed 2", "placed 3"]);
}

/// Runs every case of [`outbox_table`](crate::conformance::outbox_table)
/// as a test, each on a table from `$fixture` (an `async fn() -> impl
/// OutboxTable`).
#[macro_export]
macro_rules! outbox_table_suite {
    ($fixture:path) => {
        $crate::outbox_table_suite!(
            $fixture;
            a_message_exists_exactly_when_its_transaction_commits,
            concurrent_dispatchers_send_each_message_once,
            a_dead_dispatcher_or_an_absent_broker_leaves_messages_due_again,
            a_send_that_fails_mid_batch_keeps_the_rest_and_their_order,
        );
    };
    ($fixture:path; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let table = $fixture().await;
                $crate::conformance::outbox_table::$case(&table).await;
            }
        )+
    };
}
