//! The transactional inbox: the dedup row is written **inside your own
//! transaction**, so it commits or rolls back together with your business
//! writes. No lease is needed. A concurrent duplicate's insert waits on the
//! primary key until the first transaction ends, then sees its committed
//! row (or, if it rolled back, goes ahead as new). A crash can never leave
//! the business write without the dedup row, or the other way round.
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::RecordId;
//! use idem_postgres::inbox::{Inbox, InboxOutcome};
//! use std::time::Duration;
//!
//! let inbox = Inbox::new(Duration::from_secs(7 * 24 * 3600));
//! inbox.setup(client).await?; // or apply idem_postgres::migrations() yourself
//!
//! let id = RecordId::parse("payments", "msg-17")?;
//! let tx = client.transaction().await?;
//! match inbox.claim(&tx, &id, None).await? {
//!     InboxOutcome::New => {
//!         tx.execute("UPDATE accounts SET balance = balance + 1250 WHERE id = 7", &[]).await?;
//!         inbox.set_response(&tx, &id, b"credited").await?;
//!         tx.commit().await?; // the credit and the dedup row, or neither
//!     }
//!     InboxOutcome::Duplicate { .. } => {} // done before: ack and move on
//!     InboxOutcome::Mismatch => {}         // same id, different message: dead-letter it
//! }
//! # Ok(()) }
//! ```
//!
//! Use the default `READ COMMITTED` isolation. Under `REPEATABLE READ` or
//! `SERIALIZABLE`, a duplicate that waited cannot see the row it waited
//! for; PostgreSQL then aborts it with a serialization failure
//! ([`InboxError::is_retryable`]), and running the transaction again finds
//! the duplicate.
//!
#![cfg_attr(feature = "sqlx", doc = include_str!("../docs/inbox_sqlx.md"))]
#![doc = include_str!("../docs/natural.md")]

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Transaction};

use idem::{Fingerprint, RecordId};

use crate::encode::ms;
use crate::schema;
use run::{DbError, Param};

pub use idem::InboxOutcome;
pub use partition::PARTITIONS_AHEAD;

/// Why an inbox operation failed. Roll the transaction back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The inbox table is missing: run [`Inbox::setup`] (or apply
    /// [`crate::migrations`]) first.
    #[error("the {table} table does not exist: run Inbox::setup or apply idem_postgres::migrations() first")]
    NotSetUp {
        /// The table looked for.
        table: String,
    },
    /// A partitioned inbox has no partition for now: run
    /// [`Inbox::maintain`] (it makes partitions ahead of time) first.
    #[error("{table} has no partition for the current time: run Inbox::maintain")]
    NoPartition {
        /// The partitioned table.
        table: String,
    },
    /// A partitioned inbox claim in a transaction that is not `READ
    /// COMMITTED`: after waiting for a duplicate, its snapshot could miss
    /// the row the duplicate committed.
    #[error("the partitioned inbox needs READ COMMITTED transactions, not REPEATABLE READ or SERIALIZABLE")]
    Isolation,
    /// [`Inbox::maintain`] on an inbox that is not partitioned: use
    /// [`Inbox::purge_expired`].
    #[error("maintain is for partitioned inboxes; this one is a plain table: use purge_expired")]
    NotPartitioned,
    /// [`Inbox::set_response`] for a key this transaction has not claimed,
    /// or whose response is already set (the first is never overwritten).
    #[error("set_response for {id}: no live claim without a response")]
    NotClaimed {
        /// The key, as `scope/key`.
        id: String,
    },
    /// Any other PostgreSQL error; see [`is_retryable`](Self::is_retryable).
    #[error("PostgreSQL error in the inbox")]
    Postgres(#[source] tokio_postgres::Error),
    /// Any other error from sqlx; see [`is_retryable`](Self::is_retryable).
    #[cfg(feature = "sqlx")]
    #[error("sqlx error in the inbox")]
    Sqlx(#[source] sqlx::Error),
}

impl InboxError {
    /// Whether running the whole transaction again may succeed: the
    /// store's transient SQLSTATEs (a serialization failure, a deadlock, a
    /// lock or statement timeout, a failover, a server shutting down or
    /// short of resources), or a lost connection.
    pub fn is_retryable(&self) -> bool {
        let retryable_state = crate::error::transient_sqlstate;
        match self {
            InboxError::Postgres(e) => match e.code() {
                Some(state) => retryable_state(state.code()),
                None => e.is_closed(),
            },
            #[cfg(feature = "sqlx")]
            InboxError::Sqlx(e) => match e {
                sqlx::Error::Database(db) => db.code().is_some_and(|c| retryable_state(&c)),
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                _ => false,
            },
            _ => false,
        }
    }
}

/// Dedup rows inside the caller's transactions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Inbox {
    schema: String,
    retention: Duration,
    /// Partition width in seconds, for the partitioned layout.
    partition_secs: Option<u64>,
    sql: InboxSql,
}

/// The inbox's statements, with the schema filled in.
#[derive(Debug, Clone)]
struct InboxSql {
    /// Run first, if any; it must return a row.
    lock: Option<Arc<str>>,
    /// Run in order until one writes a row: the claim is then new.
    claim: Vec<Arc<str>>,
    read: Arc<str>,
    respond: Arc<str>,
    purge: Arc<str>,
}

/// What [`Inbox::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Maintenance {
    /// The partitions it made (they did not exist yet).
    pub created: Vec<String>,
    /// The partitions it detached and dropped: their ranges ended at least
    /// the retention ago and all their rows had expired.
    pub dropped: Vec<String>,
    /// Another maintainer holds the upkeep lease, so this call did nothing.
    pub busy: bool,
}

impl Inbox {
    /// An inbox in the `public` schema that keeps rows for `retention`
    /// (longer than any redelivery window of the source).
    pub fn new(retention: Duration) -> Self {
        Self::in_schema(crate::DEFAULT_SCHEMA, retention)
    }

    /// An inbox in `schema`.
    ///
    /// # Panics
    ///
    /// If `schema` is not 1 to 63 characters of `a-z 0-9 _` (not starting
    /// with a digit): a schema name is the program's own constant.
    pub fn in_schema(schema: &str, retention: Duration) -> Self {
        let schema = schema::checked(schema);
        let r = |sql: &str| Arc::from(schema::render(sql, schema));
        Self {
            schema: schema.to_owned(),
            retention,
            partition_secs: None,
            sql: InboxSql {
                lock: None,
                claim: vec![
                    r(include_str!("../sql/inbox_claim.sql")),
                    r(include_str!("../sql/inbox_renew.sql")),
                ],
                read: r(include_str!("../sql/inbox_read.sql")),
                respond: r(include_str!("../sql/inbox_respond.sql")),
                purge: r(include_str!("../sql/inbox_purge.sql")),
            },
        }
    }

    /// The time-partitioned layout: rows go to `<schema>.idem_inbox_p`,
    /// range-partitioned by creation time into partitions `width` wide
    /// (whole seconds, at least one, at most ten years).
    /// [`maintain`](Self::maintain) makes partitions ahead of time and drops
    /// a partition once its range ended at least the retention ago and all
    /// its rows have expired: dropping it is the purge, with no row-by-row
    /// delete and no vacuum debt.
    ///
    /// PostgreSQL cannot keep `(scope, key)` unique across partitions, so
    /// each claim first takes a transaction advisory lock on its key (a
    /// duplicate waits there, as it waits on the primary key in the plain
    /// layout) and then looks for a live row in every partition, one index
    /// probe each. Claims need `READ COMMITTED` (the default) and refuse
    /// any other level with [`InboxError::Isolation`]. The two layouts are
    /// separate tables: switching is a new inbox, not a migration.
    pub fn partitioned(mut self, width: Duration) -> Self {
        let secs = width
            .as_secs()
            .saturating_add(u64::from(width.subsec_nanos() > 0));
        let r = |sql: &str| Arc::from(schema::render(sql, &self.schema));
        self.sql = InboxSql {
            lock: Some(r(include_str!("../sql/inbox_p_lock.sql"))),
            claim: vec![r(include_str!("../sql/inbox_p_claim.sql"))],
            read: r(include_str!("../sql/inbox_p_read.sql")),
            respond: r(include_str!("../sql/inbox_p_respond.sql")),
            purge: r(include_str!("../sql/inbox_p_purge.sql")),
        };
        self.partition_secs = Some(secs.clamp(1, partition::MAX_WIDTH_SECS));
        self
    }

    fn table(&self) -> String {
        let name = match self.partition_secs {
            Some(_) => "idem_inbox_p",
            None => "idem_inbox",
        };
        format!("{}.{name}", self.schema)
    }

    /// Applies idem's migrations (the store's and the inbox's tables) in
    /// this inbox's schema; for a partitioned inbox, also makes its first
    /// partitions ([`maintain`](Self::maintain)).
    pub async fn setup(&self, client: &mut Client) -> Result<(), InboxError> {
        schema::apply(client, &self.schema)
            .await
            .map_err(|e| self.error(DbError::Postgres(e)))?;
        if self.partition_secs.is_some() {
            self.maintain(client).await?;
        }
        Ok(())
    }

    /// For a partitioned inbox: detaches (`CONCURRENTLY`, so business
    /// transactions are not blocked) and drops every partition whose range
    /// ended at least the retention ago and whose rows have all expired
    /// (checked again once detached, before the drop), then makes the
    /// partitions for the current time and the next [`PARTITIONS_AHEAD`]
    /// widths that do not exist yet. Run it at least once per partition
    /// width, on a connection outside any transaction. Safe to run from
    /// several processes at once: one works, the others return at once
    /// with [`Maintenance::busy`]. The worker holds a lease, not a lock
    /// (ten minutes at most), so one that dies or is cancelled halfway
    /// holds up the others for no longer than that.
    pub async fn maintain(&self, client: &Client) -> Result<Maintenance, InboxError> {
        let width = self.partition_secs.ok_or(InboxError::NotPartitioned)?;
        partition::maintain(client, &self.schema, width, self.retention)
            .await
            .map_err(|e| self.error(DbError::Postgres(e)))
    }

    fn error(&self, e: DbError) -> InboxError {
        let code = e.code();
        if code.as_deref() == Some(SqlState::UNDEFINED_TABLE.code()) {
            return InboxError::NotSetUp {
                table: self.table(),
            };
        }
        if self.partition_secs.is_some()
            && code.as_deref() == Some(SqlState::CHECK_VIOLATION.code())
        {
            return InboxError::NoPartition {
                table: self.table(),
            };
        }
        match e {
            DbError::Postgres(e) => InboxError::Postgres(e),
            #[cfg(feature = "sqlx")]
            DbError::Sqlx(e) => InboxError::Sqlx(e),
        }
    }

    /// Records `id` as processed by this transaction if it is new (absent
    /// or past its retention). Call it first in the transaction: a
    /// concurrent duplicate then waits here until this transaction ends.
    ///
    /// `tx` is a transaction: see [`InboxTransaction`].
    pub async fn claim(
        &self,
        mut tx: impl InboxTransaction,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
    ) -> Result<InboxOutcome, InboxError> {
        let fp = fingerprint.map(|f| f.as_bytes().to_vec());
        let (scope, key) = (id.scope().as_str(), id.key().as_str());
        let params = [
            Param::Text(scope),
            Param::Text(key),
            Param::Bytes(fp.as_deref()),
            Param::Float(ms(self.retention)),
        ];
        if let Some(lock) = &self.sql.lock {
            let taken = tx
                .read(lock, &params[..2])
                .await
                .map_err(|e| self.error(e))?;
            if taken.is_none() {
                return Err(InboxError::Isolation);
            }
        }
        loop {
            for sql in &self.sql.claim {
                let written = tx.execute(sql, &params).await.map_err(|e| self.error(e))?;
                if written > 0 {
                    return Ok(InboxOutcome::New);
                }
            }
            let Some((stored, response)) = tx
                .read(&self.sql.read, &params[..2])
                .await
                .map_err(|e| self.error(e))?
            else {
                // Purged or expired between the statements: try again.
                continue;
            };
            if stored != fp {
                return Ok(InboxOutcome::Mismatch);
            }
            return Ok(InboxOutcome::Duplicate { response });
        }
    }

    /// Stores the response duplicates will see, in the same transaction as
    /// the claim. A response already stored is never overwritten.
    pub async fn set_response(
        &self,
        mut tx: impl InboxTransaction,
        id: &RecordId,
        response: &[u8],
    ) -> Result<(), InboxError> {
        let params = [
            Param::Text(id.scope().as_str()),
            Param::Text(id.key().as_str()),
            Param::Bytes(Some(response)),
        ];
        let updated = tx
            .execute(&self.sql.respond, &params)
            .await
            .map_err(|e| self.error(e))?;
        if updated == 0 {
            return Err(InboxError::NotClaimed { id: id.to_string() });
        }
        Ok(())
    }

    /// Deletes at most `limit` rows past their retention, skipping rows
    /// other transactions hold; returns how many. Run it outside business
    /// transactions, again while it returns `limit`.
    ///
    /// `client` is a connection: see [`InboxExecutor`] (with sqlx,
    /// `&mut *pool.acquire().await?`).
    pub async fn purge_expired(
        &self,
        mut client: impl InboxExecutor,
        limit: usize,
    ) -> Result<u64, InboxError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        client
            .execute(&self.sql.purge, &[Param::Int(limit)])
            .await
            .map_err(|e| self.error(e))
    }
}

/// What the inbox's claim and response run in: a transaction, so the dedup
/// row commits or rolls back with the business writes. Implemented for
/// `&tokio_postgres::Transaction<'_>`, `&deadpool_postgres::Transaction<'_>`
/// and, with the `sqlx` feature, `&mut sqlx::Transaction<'_, sqlx::Postgres>`.
/// Sealed.
pub trait InboxTransaction: run::Run {}

/// What [`Inbox::purge_expired`] runs on: a `&` tokio-postgres `Client` or
/// `Transaction`, a `&` deadpool-postgres `Object` or `Transaction` and,
/// with the `sqlx` feature, `&mut sqlx::PgConnection`. Sealed.
pub trait InboxExecutor: run::Run {}

impl InboxTransaction for &Transaction<'_> {}
impl InboxTransaction for &deadpool_postgres::Transaction<'_> {}
impl InboxExecutor for &Client {}
impl InboxExecutor for &Transaction<'_> {}
impl InboxExecutor for &deadpool_postgres::Object {}
impl InboxExecutor for &deadpool_postgres::Transaction<'_> {}

mod partition;
pub(crate) mod run;
