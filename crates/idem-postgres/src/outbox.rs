//! The transactional outbox: messages a producer that is not a handler
//! (a web request writing an order, a batch job) enqueues **inside its
//! own transaction**, so they exist exactly when its business writes do,
//! and a dispatcher sends once that transaction committed.
//!
//! ```no_run
//! # async fn example(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::outbox::{MemorySender, Message};
//! use idem_postgres::Outbox;
//!
//! let outbox = Outbox::new();
//! outbox.setup(client).await?;
//!
//! let tx = client.transaction().await?;
//! tx.execute("INSERT INTO orders (id, total) VALUES ($1, $2)", &[&7i64, &1250i64]).await?;
//! outbox.enqueue(&tx, &Message::new("order-events", r#"{"placed":7}"#)).await?;
//! tx.commit().await?; // the order and its message, or neither
//!
//! // Elsewhere: one pass sends what is due and deletes what was confirmed.
//! let sender = MemorySender::new(); // a broker's sender in production
//! let pass = outbox.dispatch(client, &sender, 256).await?;
//! # let _ = pass;
//! # Ok(())
//! # }
//! ```
//!
//! [`Outbox::run`] is the dispatcher as a loop: woken when a producer's
//! transaction that enqueued commits (migration 0009 announces it on the
//! store's `LISTEN` connection), and otherwise looking every `every` for
//! messages that came due again after a failed send.
//!
//! Delivery is at least once, each message under its id (a UUIDv7 minted
//! when it was made, or the producer's own with `Message::with_id`), which
//! senders pass as the broker's deduplication id and as `Idempotency-Key`.
//! Messages are sent in the order they were enqueued, a batch at a time;
//! a send that fails stops the batch, and the rest come due again after
//! the dispatcher's lease. Several dispatchers may run at once: each row
//! is taken by one (`FOR UPDATE SKIP LOCKED`), and only its taker deletes
//! it.

use std::sync::Arc;
use std::time::Duration;

use idem::outbox::table::{self, headers_json, message_from_row, send_in_order, TakenRow};
use idem::outbox::{Message, Sender};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::inbox::run::{DbError, Param};
use crate::inbox::InboxTransaction;
use crate::schema;

pub use idem::outbox::table::DEFAULT_DISPATCH_LEASE;

/// Why the outbox could not enqueue or dispatch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The outbox table is missing: run [`Outbox::setup`] (or apply
    /// [`crate::migrations`]) first.
    #[error("the {table} table does not exist: run Outbox::setup or apply idem_postgres::migrations() first")]
    NotSetUp {
        /// The table looked for.
        table: String,
    },
    /// Any other PostgreSQL error.
    #[error("PostgreSQL error in the outbox")]
    Postgres(#[source] tokio_postgres::Error),
    /// No connection of the store's pool could be had.
    #[error("no connection to PostgreSQL for the outbox")]
    Connection(#[source] idem::StoreError),
    /// Any other error from sqlx.
    #[cfg(feature = "sqlx")]
    #[error("sqlx error in the outbox")]
    Sqlx(#[source] sqlx::Error),
}

/// How long [`Outbox::run`] waits between looks when no enqueue wakes it:
/// for messages that come due again after a failed send, and where the
/// store cannot listen.
pub const DEFAULT_DISPATCH_EVERY: Duration = Duration::from_secs(5);

pub use idem::outbox::OutboxPass;

/// The outbox table in one schema. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    schema: String,
    enqueue: Arc<str>,
    take: Arc<str>,
    done: Arc<str>,
    due: Arc<str>,
    lease: Duration,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// The outbox in the `public` schema.
    pub fn new() -> Self {
        Self::in_schema(crate::DEFAULT_SCHEMA)
    }

    /// The outbox in `schema`.
    ///
    /// # Panics
    ///
    /// If `schema` is not 1 to 63 characters of `a-z 0-9 _` (not starting
    /// with a digit): a schema name is the program's own constant.
    pub fn in_schema(schema: &str) -> Self {
        let schema = schema::checked(schema);
        let r = |sql: &str| Arc::from(schema::render(sql, schema));
        Self {
            schema: schema.to_owned(),
            enqueue: r(include_str!("../sql/outbox_enqueue.sql")),
            take: r(include_str!("../sql/outbox_take.sql")),
            done: r(include_str!("../sql/outbox_done.sql")),
            due: r(include_str!("../sql/outbox_due.sql")),
            lease: DEFAULT_DISPATCH_LEASE,
        }
    }

    /// How long a dispatcher keeps the rows it took ([`DEFAULT_DISPATCH_LEASE`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    fn table(&self) -> String {
        format!("{}.idem_outbox", self.schema)
    }

    fn error(&self, e: DbError) -> OutboxError {
        if e.code().as_deref() == Some(SqlState::UNDEFINED_TABLE.code()) {
            return OutboxError::NotSetUp {
                table: self.table(),
            };
        }
        match e {
            DbError::Postgres(e) => OutboxError::Postgres(e),
            #[cfg(feature = "sqlx")]
            DbError::Sqlx(e) => OutboxError::Sqlx(e),
        }
    }

    /// Applies idem's migrations (the outbox table among them) in this
    /// outbox's schema.
    pub async fn setup(&self, client: &mut Client) -> Result<(), OutboxError> {
        schema::apply(client, &self.schema)
            .await
            .map_err(|e| self.error(DbError::Postgres(e)))?;
        Ok(())
    }

    /// Enqueues `message` in the caller's transaction `tx`: it exists, and
    /// will be sent, exactly if `tx` commits. Refused as the context's
    /// [`send`](idem::Context::send) refuses nothing else: the message's
    /// fields were checked when it was made.
    pub async fn enqueue(
        &self,
        mut tx: impl InboxTransaction,
        message: &Message,
    ) -> Result<(), OutboxError> {
        let headers = headers_json(message);
        let params = [
            Param::Text(message.id()),
            Param::Text(message.destination()),
            Param::Text(&headers),
            Param::Bytes(Some(message.payload())),
        ];
        tx.execute(&self.enqueue, &params)
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    /// Takes up to `batch` due messages, oldest first, sends them in
    /// order through `sender`, and deletes the ones it confirmed. A send
    /// that fails stops the batch: the rest stay taken until the lease
    /// ends, then come due again (the failed one first). Call it in a
    /// loop, sooner while it returns full batches.
    pub async fn dispatch(
        &self,
        client: &Client,
        sender: &impl Sender,
        batch: usize,
    ) -> Result<OutboxPass, OutboxError> {
        let token: i64 = rand::random();
        let secs = self.lease.as_secs_f64();
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        let mut rows = client
            .query_typed(
                &self.take,
                &[
                    (&secs, Type::FLOAT8),
                    (&token, Type::INT8),
                    (&limit, Type::INT8),
                ],
            )
            .await
            .map_err(|e| self.error(DbError::Postgres(e)))?;
        rows.sort_by_key(|row| row.get::<_, i64>(0));
        let taken = rows.len();
        let messages: Vec<TakenRow> = rows
            .iter()
            .map(|row| (row.get::<_, i64>(0), message_of(row)))
            .collect();
        let (sent, failed) = send_in_order(messages, sender).await;
        if !sent.is_empty() {
            client
                .execute_typed(
                    &self.done,
                    &[(&sent, Type::INT8_ARRAY), (&token, Type::INT8)],
                )
                .await
                .map_err(|e| self.error(DbError::Postgres(e)))?;
        }
        Ok(OutboxPass {
            taken,
            sent: sent.len(),
            failed,
        })
    }

    /// The dispatcher: [`dispatch`](Self::dispatch)es batches of `batch`
    /// on `store`'s connections until a pass takes less than a full batch
    /// or a send fails, then waits until a producer's transaction that
    /// enqueued commits (announced on `store`'s listening connection) or
    /// `every` passes ([`DEFAULT_DISPATCH_EVERY`]; messages a failed send
    /// left come due again after the [lease](Self::lease)), and again.
    /// Where `store` cannot listen (`listen=false`, no connection to
    /// spare) it looks every `every`. Errors are logged and tried again
    /// at the next look. It never returns: run it in a task, and abort
    /// the task (or drop the future) to stop it; a pass cut short leaves
    /// its rows to come due again after the lease.
    pub async fn run(
        &self,
        store: &crate::PgStore,
        sender: &impl Sender,
        batch: usize,
        every: Duration,
    ) {
        let channel = format!("{}:outbox", self.schema);
        let listener = &store.inner.listener;
        loop {
            // In before the pass, so an enqueue committed during it is due
            // when the wait first looks.
            let waiter = listener
                .listening(every)
                .await
                .then(|| listener.waiters().enter(channel.clone()));
            self.drain(store, sender, batch).await;
            match waiter {
                Some(waiter) => {
                    let mut looked = false;
                    waiter
                        .wait(every, || {
                            // One look for what came due meanwhile; later
                            // safety-net wake-ups of the wait cost nothing.
                            let look = !std::mem::replace(&mut looked, true);
                            async move { !look || !self.is_due(store).await }
                        })
                        .await;
                }
                None => tokio::time::sleep(every).await,
            }
        }
    }

    /// Dispatches what is due on `store`'s connections, a batch at a
    /// time, until a pass takes less than a full batch or a send fails:
    /// what [`run`](Self::run) does at each look, for a caller that
    /// schedules the looks itself (a cron job, `idem outbox run --once`).
    pub async fn dispatch_due(
        &self,
        store: &crate::PgStore,
        sender: &impl Sender,
        batch: usize,
    ) -> Result<OutboxPass, OutboxError> {
        table::dispatch_due(batch, || async {
            let client = store.client().await.map_err(OutboxError::Connection)?;
            self.dispatch(&client, sender, batch).await
        })
        .await
    }

    /// [`dispatch_due`](Self::dispatch_due), its error logged: the next
    /// look tries again.
    async fn drain(&self, store: &crate::PgStore, sender: &impl Sender, batch: usize) {
        if let Err(error) = self.dispatch_due(store, sender, batch).await {
            tracing::warn!(error = %idem::error_chain(&error), "the outbox dispatcher's pass failed; trying again at the next look");
        }
    }

    /// Whether a message is due; `true` when that cannot be read (the
    /// pass that follows finds out).
    async fn is_due(&self, store: &crate::PgStore) -> bool {
        let Ok(client) = store.client().await else {
            return true;
        };
        client
            .query_one(self.due.as_ref(), &[])
            .await
            .map_or(true, |row| row.get::<_, bool>(0))
    }
}

/// The message a taken row holds.
fn message_of(row: &tokio_postgres::Row) -> Result<Message, String> {
    let id: String = row.try_get(1).map_err(|e| e.to_string())?;
    let destination: String = row.try_get(2).map_err(|e| e.to_string())?;
    let headers: String = row.try_get(3).map_err(|e| e.to_string())?;
    let payload: Vec<u8> = row.try_get(4).map_err(|e| e.to_string())?;
    message_from_row(&id, destination, &headers, payload)
}
