//! The transactional outbox: messages a producer that is not a handler (a
//! request writing an order, a batch job) enqueues **inside its own
//! transaction**, so they exist exactly when its business writes do, and
//! a dispatcher sends once that transaction committed.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Mutex;
//!
//! use idem::outbox::{MemorySender, Message};
//! use idem_sqlite::outbox::Outbox;
//! use rusqlite::{Connection, TransactionBehavior};
//!
//! let mut conn = Connection::open_in_memory()?;
//! conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, cents INTEGER)")?;
//! let outbox = Outbox::new();
//! outbox.setup(&conn)?;
//!
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! tx.execute("INSERT INTO orders VALUES (7, 1250)", [])?;
//! outbox.enqueue(&tx, &Message::new("order-events", r#"{"placed":7}"#))?;
//! tx.commit()?; // the order and its message, or neither
//!
//! // The dispatcher: send what is due, delete what was confirmed.
//! let conn = Mutex::new(conn);
//! let sender = MemorySender::new(); // a broker's sender in production
//! let pass = outbox.dispatch(&conn, &sender, 256).await?;
//! assert_eq!((pass.taken, pass.sent), (1, 1));
//! assert_eq!(sender.messages()[0].destination(), "order-events");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! Delivery is at least once, each message under its id (a UUIDv7 minted
//! when it was made, or the producer's own with `Message::with_id`), which
//! senders pass as the broker's deduplication id and as `Idempotency-Key`.
//! Messages are sent in the order they were enqueued, a batch at a time;
//! a send that fails stops the batch, and the rest come due again after
//! the dispatcher's lease. Several dispatchers (threads, processes) may
//! run at once on one file: each row is taken by one (a single `UPDATE`
//! under SQLite's write lock), and only its taker deletes it. Times are
//! the writing process's clock, as for the [inbox](crate::inbox).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use idem::outbox::table::{self, headers_json, message_from_row, send_in_order, TakenRow};
use idem::outbox::{Message, OutboxPass, Sender};
use idem::{Clock, SystemClock};
use rusqlite::{params, Connection};

use crate::encode::millis;

pub use idem::outbox::table::DEFAULT_DISPATCH_LEASE;

const SETUP: &str = include_str!("../migrations/outbox_0001.sql");

/// Why the outbox could not enqueue or dispatch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The outbox table is missing: call [`Outbox::setup`] first.
    #[error("the idem_outbox table does not exist: call Outbox::setup on this database first")]
    NotSetUp(#[source] rusqlite::Error),
    /// [`Outbox::enqueue`] on a connection not inside a transaction: the
    /// message would commit on its own instead of with your writes.
    #[error("the outbox must be written inside a transaction (begin one with TransactionBehavior::Immediate)")]
    NotInTransaction,
    /// Any other SQLite error (a lock wait past the busy timeout among
    /// them).
    #[error("SQLite error in the outbox")]
    Sqlite(#[source] rusqlite::Error),
}

impl From<rusqlite::Error> for OutboxError {
    fn from(e: rusqlite::Error) -> Self {
        if e.to_string().contains("no such table: idem_outbox") {
            Self::NotSetUp(e)
        } else {
            Self::Sqlite(e)
        }
    }
}

/// The outbox table of one SQLite database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox<C: Clock = SystemClock> {
    lease: Duration,
    clock: C,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// The outbox, on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl<C: Clock> Outbox<C> {
    /// The outbox reading time from `clock`.
    pub fn with_clock(clock: C) -> Self {
        Self {
            lease: DEFAULT_DISPATCH_LEASE,
            clock,
        }
    }

    /// How long a dispatcher keeps the rows it took
    /// ([`DEFAULT_DISPATCH_LEASE`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Creates the `idem_outbox` table and its index if they do not exist
    /// (`migrations/outbox_0001.sql`).
    pub fn setup(&self, conn: &Connection) -> Result<(), OutboxError> {
        conn.execute_batch(SETUP)?;
        Ok(())
    }

    /// Enqueues `message` in the caller's transaction `tx`: it exists,
    /// and will be sent, exactly if `tx` commits.
    pub fn enqueue(&self, tx: &Connection, message: &Message) -> Result<(), OutboxError> {
        if tx.is_autocommit() {
            return Err(OutboxError::NotInTransaction);
        }
        let now = millis(self.clock.now());
        tx.prepare_cached(
            "INSERT INTO idem_outbox (id, destination, headers, payload, enqueued_at, due_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
        )?
        .execute(params![
            message.id(),
            message.destination(),
            headers_json(message),
            message.payload().as_ref(),
            now
        ])?;
        Ok(())
    }

    /// Takes up to `batch` due messages, oldest first, sends them in
    /// order through `sender`, and deletes the ones it confirmed. A send
    /// that fails stops the batch: the rest stay taken until the lease
    /// ends, then come due again (the failed one first). The lock on
    /// `conn` is held only while SQLite works (to take the rows, then to
    /// delete the sent ones), never while a message is sent. Call it in a
    /// loop, sooner while it returns full batches.
    pub async fn dispatch(
        &self,
        conn: &Mutex<Connection>,
        sender: &impl Sender,
        batch: usize,
    ) -> Result<OutboxPass, OutboxError> {
        let token: i64 = rand::random();
        let mut rows = self.take(&lock(conn), token, batch)?;
        rows.sort_by_key(|(seq, _)| *seq);
        let taken = rows.len();
        let (sent, failed) = send_in_order(rows, sender).await;
        if !sent.is_empty() {
            let mut conn = lock(conn);
            let tx = conn.transaction()?;
            {
                let mut done =
                    tx.prepare_cached("DELETE FROM idem_outbox WHERE seq = ?1 AND taken_by = ?2")?;
                for seq in &sent {
                    done.execute(params![seq, token])?;
                }
            }
            tx.commit()?;
        }
        Ok(OutboxPass {
            taken,
            sent: sent.len(),
            failed,
        })
    }

    /// Dispatches what is due, a batch at a time, until a pass takes
    /// less than a full batch or a send fails: what [`run`](Self::run)
    /// does at each look, for a caller that schedules the looks itself.
    pub async fn dispatch_due(
        &self,
        conn: &Mutex<Connection>,
        sender: &impl Sender,
        batch: usize,
    ) -> Result<OutboxPass, OutboxError> {
        table::dispatch_due(batch, || self.dispatch(conn, sender, batch)).await
    }

    /// The dispatcher: [`dispatch_due`](Self::dispatch_due) every
    /// `every`, errors logged and tried again at the next look. SQLite
    /// tells no other process of a commit, so this looks on a timer: a
    /// message waits up to `every` (and a lease more after a failed
    /// send). It never returns: run it in a task and abort the task to
    /// stop it.
    pub async fn run(
        &self,
        conn: &Mutex<Connection>,
        sender: &impl Sender,
        batch: usize,
        every: Duration,
    ) {
        table::dispatch_every(every, || self.dispatch_due(conn, sender, batch)).await;
    }

    /// Takes the due rows (one statement: atomic under SQLite's write
    /// lock), moving them a lease ahead under `token`.
    fn take(
        &self,
        conn: &Connection,
        token: i64,
        batch: usize,
    ) -> Result<Vec<TakenRow>, OutboxError> {
        let now = self.clock.now();
        let mut take = conn.prepare_cached(
            "UPDATE idem_outbox SET due_at = ?2, taken_by = ?3, attempts = attempts + 1 \
             WHERE seq IN (SELECT seq FROM idem_outbox WHERE due_at <= ?1 \
                           ORDER BY due_at, seq LIMIT ?4) \
             RETURNING seq, id, destination, headers, payload",
        )?;
        let rows = take.query_map(
            params![
                millis(now),
                millis(now.saturating_add(self.lease)),
                token,
                i64::try_from(batch).unwrap_or(i64::MAX)
            ],
            |row| {
                let seq: i64 = row.get(0)?;
                let id: String = row.get(1)?;
                let destination: String = row.get(2)?;
                let headers: String = row.get(3)?;
                let payload: Vec<u8> = row.get(4)?;
                Ok((seq, message_from_row(&id, destination, &headers, payload)))
            },
        )?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// The connection, even if a thread panicked while holding it (SQLite
/// keeps its own consistency: a statement cut short rolls back).
fn lock(conn: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    conn.lock().unwrap_or_else(PoisonError::into_inner)
}
