//! The transactional outbox: messages a producer that is not a handler
//! (a web request writing an order, a batch job) enqueues **inside its
//! own transaction**, so they exist exactly when its business writes do,
//! and a dispatcher sends once that transaction committed.
//!
//! ```no_run
//! # async fn example(pool: &mysql_async::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::outbox::{MemorySender, Message};
//! use idem_mysql::outbox::Outbox;
//! use mysql_async::prelude::Queryable;
//! use mysql_async::TxOpts;
//!
//! let outbox = Outbox::new();
//! outbox.setup(&mut pool.get_conn().await?).await?; // or apply idem_mysql::migrations()
//!
//! let mut conn = pool.get_conn().await?;
//! let mut tx = conn.start_transaction(TxOpts::default()).await?;
//! tx.exec_drop("INSERT INTO orders (id, total) VALUES (?, ?)", (7, 1250)).await?;
//! outbox.enqueue(&mut tx, &Message::new("order-events", r#"{"placed":7}"#)).await?;
//! tx.commit().await?; // the order and its message, or neither
//!
//! // Elsewhere: send what is due and delete what was confirmed.
//! let sender = MemorySender::new(); // a broker's sender in production
//! let pass = outbox.dispatch_due(pool, &sender, 256).await?;
//! # let _ = pass;
//! # Ok(())
//! # }
//! ```
//!
//! Delivery is at least once, each message under its id (a UUIDv7 minted
//! when it was made, or the producer's own with `Message::with_id`), which
//! senders pass as the broker's deduplication id and as `Idempotency-Key`.
//! Messages are sent in the order they were enqueued, a batch at a time;
//! a send that fails stops the batch, and the rest come due again after
//! the dispatcher's lease. Several dispatchers may run at once: each row
//! is taken by one (a single `UPDATE … ORDER BY … LIMIT`), and only its
//! taker deletes it. Times are the server's clock. MySQL tells no other
//! connection of a commit, so [`Outbox::run`] looks on a timer.

use std::time::Duration;

use idem::outbox::table::{self, headers_json, message_from_row, send_in_order, TakenRow};
use idem::outbox::{Message, Sender};
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Transaction, Value};

use crate::encode::ms;
use crate::schema;
use crate::sql::text;

pub use idem::outbox::table::DEFAULT_DISPATCH_LEASE;
pub use idem::outbox::OutboxPass;

/// How long [`Outbox::run`] waits between looks.
pub const DEFAULT_DISPATCH_EVERY: Duration = Duration::from_secs(1);

/// Why the outbox could not enqueue or dispatch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The outbox table is missing: run [`Outbox::setup`] (or apply
    /// [`crate::migrations`]) first.
    #[error("the idem_outbox table does not exist: run Outbox::setup or apply idem_mysql::migrations() first")]
    NotSetUp,
    /// Any other error from the server or the driver.
    #[error("MySQL error in the outbox")]
    MySql(#[source] mysql_async::Error),
}

impl From<mysql_async::Error> for OutboxError {
    fn from(error: mysql_async::Error) -> Self {
        match &error {
            mysql_async::Error::Server(e) if e.code == 1146 => OutboxError::NotSetUp,
            _ => OutboxError::MySql(error),
        }
    }
}

/// A taken row as read back: its sequence number, id, destination,
/// headers and payload.
type Row = (i64, String, String, String, Vec<u8>);

/// The outbox table in the connection's database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    enqueue: String,
    take: String,
    taken: String,
    done: String,
    lease: Duration,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// The outbox of the connection's database.
    pub fn new() -> Self {
        Self {
            enqueue: text(include_str!("../sql/outbox_enqueue.sql")),
            take: text(include_str!("../sql/outbox_take.sql")),
            taken: text(include_str!("../sql/outbox_taken.sql")),
            done: text(include_str!("../sql/outbox_done.sql")),
            lease: DEFAULT_DISPATCH_LEASE,
        }
    }

    /// How long a dispatcher keeps the rows it took ([`DEFAULT_DISPATCH_LEASE`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Applies idem's migrations (the outbox table among them) in the
    /// connection's database. Outside a transaction: MySQL commits each
    /// table it creates.
    pub async fn setup(&self, conn: &mut impl Queryable) -> Result<(), OutboxError> {
        schema::apply(conn).await?;
        Ok(())
    }

    /// Enqueues `message` in the caller's transaction `tx`: it exists, and
    /// will be sent, exactly if `tx` commits.
    pub async fn enqueue(
        &self,
        tx: &mut Transaction<'_>,
        message: &Message,
    ) -> Result<(), OutboxError> {
        let params = vec![
            Value::from(message.id()),
            Value::from(message.destination()),
            Value::from(headers_json(message)),
            Value::Bytes(message.payload().to_vec()),
        ];
        tx.exec_drop(&self.enqueue, params).await?;
        Ok(())
    }

    /// Takes up to `batch` due messages, oldest first, sends them in
    /// order through `sender`, and deletes the ones it confirmed. A send
    /// that fails stops the batch: the rest stay taken until the lease
    /// ends, then come due again (the failed one first). No connection is
    /// held while a message is sent.
    pub async fn dispatch(
        &self,
        pool: &Pool,
        sender: &impl Sender,
        batch: usize,
    ) -> Result<OutboxPass, OutboxError> {
        let token: i64 = rand::random();
        let limit = u64::try_from(batch).unwrap_or(u64::MAX);
        let take = vec![
            Value::Int(ms(self.lease)),
            Value::Int(token),
            Value::UInt(limit),
        ];
        exec_retrying(pool, &self.take, take).await?;
        let rows: Vec<Row> = pool
            .get_conn()
            .await?
            .exec(&self.taken, vec![Value::Int(token)])
            .await?;
        let taken = rows.len();
        let rows: Vec<TakenRow> = rows
            .into_iter()
            .map(|(seq, id, destination, headers, payload)| {
                (seq, message_from_row(&id, destination, &headers, payload))
            })
            .collect();
        let (sent, failed) = send_in_order(rows, sender).await;
        if let Some(&last) = sent.last() {
            // What was sent is a prefix of the taken rows in order.
            exec_retrying(pool, &self.done, vec![Value::Int(token), Value::Int(last)]).await?;
        }
        Ok(OutboxPass {
            taken,
            sent: sent.len(),
            failed,
        })
    }

    /// Dispatches what is due, a batch at a time, until a pass takes less
    /// than a full batch or a send fails: what [`run`](Self::run) does at
    /// each look, for a caller that schedules the looks itself.
    pub async fn dispatch_due(
        &self,
        pool: &Pool,
        sender: &impl Sender,
        batch: usize,
    ) -> Result<OutboxPass, OutboxError> {
        table::dispatch_due(batch, || self.dispatch(pool, sender, batch)).await
    }

    /// The dispatcher: [`dispatch_due`](Self::dispatch_due) every `every`
    /// ([`DEFAULT_DISPATCH_EVERY`]), errors logged and tried again at the
    /// next look. It never returns: run it in a task and abort the task to
    /// stop it; a pass cut short leaves its rows to come due again after
    /// the lease.
    pub async fn run(&self, pool: &Pool, sender: &impl Sender, batch: usize, every: Duration) {
        table::dispatch_every(every, || self.dispatch_due(pool, sender, batch)).await;
    }
}

/// Tries of a statement that meets another dispatcher's locks.
const LOCK_TRIES: u32 = 8;

/// Runs `sql` on a pooled connection, again after a deadlock or a lock
/// wait timeout (1213, 1205: the server rolled the statement back, so
/// nothing was taken or deleted), a few times with a growing, jittered
/// pause. Dispatchers taking rows at once meet in InnoDB's index locks,
/// under `REPEATABLE READ` above all.
async fn exec_retrying(pool: &Pool, sql: &str, params: Vec<Value>) -> Result<(), OutboxError> {
    let mut pause = Duration::from_millis(5);
    let mut tries = 0;
    loop {
        tries += 1;
        let mut conn = pool.get_conn().await?;
        match conn.exec_drop(sql, params.clone()).await {
            Err(mysql_async::Error::Server(e))
                if matches!(e.code, 1205 | 1213) && tries < LOCK_TRIES =>
            {
                let jitter = Duration::from_micros(rand::random::<u64>() % 5_000);
                tokio::time::sleep(pause + jitter).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            done => return Ok(done?),
        }
    }
}
