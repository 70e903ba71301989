//! The transactional inbox: the dedup record is written **inside your own
//! transaction**, so it commits or rolls back together with your business
//! writes. No lease is needed: a concurrent duplicate waits on SQLite's
//! write lock until the first transaction ends, then sees its committed
//! record. This is the strongest mode, and the one to use when the effect
//! lives in the same database.
//!
//! ```
//! use idem::RecordId;
//! use idem_sqlite::inbox::{Inbox, InboxOutcome};
//! use rusqlite::{Connection, TransactionBehavior};
//! use std::time::Duration;
//!
//! let mut conn = Connection::open_in_memory()?;
//! conn.execute_batch("CREATE TABLE payments (id TEXT PRIMARY KEY, cents INTEGER)")?;
//! let inbox = Inbox::new(Duration::from_secs(7 * 24 * 3600));
//! inbox.setup(&conn)?;
//!
//! let id = RecordId::parse("payments", "msg-17")?;
//! for _delivery in 0..3 {
//!     // Begin IMMEDIATE so a duplicate in another connection waits here.
//!     let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//!     match inbox.claim(&tx, &id, None)? {
//!         InboxOutcome::New => {
//!             tx.execute("INSERT INTO payments VALUES ('p-17', 1250)", [])?;
//!             inbox.set_response(&tx, &id, b"paid")?;
//!             tx.commit()?;
//!         }
//!         InboxOutcome::Duplicate { response } => assert_eq!(response.as_deref(), Some(&b"paid"[..])),
//!         InboxOutcome::Mismatch => unreachable!(),
//!     }
//! }
//! let rows: i64 = conn.query_row("SELECT count(*) FROM payments", [], |r| r.get(0))?;
//! assert_eq!(rows, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Before reaching for a dedup table at all, consider **natural
//! idempotency**: a conditional state transition (`UPDATE orders SET status
//! = 'PAID' WHERE id = ? AND status = 'CREATED'`, then check the changed
//! row count) or a versioned upsert (`INSERT … ON CONFLICT DO UPDATE …
//! WHERE excluded.version > orders.version`) makes the write itself safe to
//! repeat. Use the inbox when the handler does several writes or must
//! return the first result to duplicates.

use std::time::Duration;

use idem::{Clock, Fingerprint, RecordId, SystemClock};
use rusqlite::{params, Connection, OptionalExtension};

use crate::encode::millis;

const SETUP: &str = include_str!("../migrations/inbox_0001.sql");

pub use idem::InboxOutcome;

/// Why an inbox operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The inbox table is missing: call [`Inbox::setup`] first.
    #[error("the idem_inbox table does not exist: call Inbox::setup on this database first")]
    NotSetUp(#[source] rusqlite::Error),
    /// The connection given is not inside a transaction, so the record
    /// would commit on its own instead of with your writes.
    #[error("the inbox must be used inside a transaction (begin one with TransactionBehavior::Immediate)")]
    NotInTransaction,
    /// [`Inbox::set_response`] for a key without a live record, or whose
    /// response is already set (the first response is never overwritten).
    #[error("set_response for {id}: no live claim without a response")]
    NotClaimed {
        /// The key, as `scope/key`.
        id: String,
    },
    /// Any other SQLite error (including a lock wait past the busy
    /// timeout); the caller's transaction should be rolled back.
    #[error("SQLite error in the inbox")]
    Sqlite(#[from] rusqlite::Error),
}

fn classify(e: rusqlite::Error) -> InboxError {
    if e.to_string().contains("no such table: idem_inbox") {
        InboxError::NotSetUp(e)
    } else {
        InboxError::Sqlite(e)
    }
}

/// Dedup records inside the caller's transactions. Cheap to copy around.
#[derive(Debug, Clone)]
pub struct Inbox<C: Clock = SystemClock> {
    retention: Duration,
    clock: C,
}

impl Inbox<SystemClock> {
    /// An inbox that keeps records for `retention` (longer than any
    /// redelivery window of the source).
    pub fn new(retention: Duration) -> Self {
        Self::with_clock(retention, SystemClock)
    }
}

impl<C: Clock> Inbox<C> {
    /// An inbox reading time from `clock`.
    pub fn with_clock(retention: Duration, clock: C) -> Self {
        Self { retention, clock }
    }

    /// Creates the `idem_inbox` table and its index if they do not exist
    /// (`migrations/inbox_0001.sql`).
    pub fn setup(&self, conn: &Connection) -> Result<(), InboxError> {
        conn.execute_batch(SETUP)?;
        Ok(())
    }

    /// Records `id` as processed by this transaction, if it is new (absent
    /// or past its retention). Call it first in a transaction begun with
    /// `TransactionBehavior::Immediate`, so a concurrent duplicate waits for
    /// this one to end and then sees its committed record.
    pub fn claim(
        &self,
        tx: &Connection,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
    ) -> Result<InboxOutcome, InboxError> {
        if tx.is_autocommit() {
            return Err(InboxError::NotInTransaction);
        }
        let now = self.clock.now();
        let fp = fingerprint.as_ref().map(|f| &f.as_bytes()[..]);
        let inserted = tx
            .prepare_cached(
                "INSERT INTO idem_inbox (scope, key, fingerprint, response, created_at, expires_at) \
                 VALUES (?1, ?2, ?3, NULL, ?4, ?5) \
                 ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, \
                 response = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at \
                 WHERE idem_inbox.expires_at <= excluded.created_at",
            )
            .map_err(classify)?
            .execute(params![
                id.scope().as_str(),
                id.key().as_str(),
                fp,
                millis(now),
                millis(now.saturating_add(self.retention)),
            ])
            .map_err(classify)?;
        if inserted == 1 {
            return Ok(InboxOutcome::New);
        }
        let (stored, response): (Option<Vec<u8>>, Option<Vec<u8>>) = tx
            .prepare_cached(
                "SELECT fingerprint, response FROM idem_inbox WHERE scope = ?1 AND key = ?2",
            )
            .map_err(classify)?
            .query_row(params![id.scope().as_str(), id.key().as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(classify)?;
        if stored.as_deref() != fp {
            return Ok(InboxOutcome::Mismatch);
        }
        Ok(InboxOutcome::Duplicate { response })
    }

    /// Stores the response duplicates will see, in the same transaction as
    /// the claim. A response already stored is never overwritten.
    pub fn set_response(
        &self,
        tx: &Connection,
        id: &RecordId,
        response: &[u8],
    ) -> Result<(), InboxError> {
        if tx.is_autocommit() {
            return Err(InboxError::NotInTransaction);
        }
        let updated = tx
            .prepare_cached(
                "UPDATE idem_inbox SET response = ?3 \
                 WHERE scope = ?1 AND key = ?2 AND response IS NULL AND expires_at > ?4",
            )
            .map_err(classify)?
            .execute(params![
                id.scope().as_str(),
                id.key().as_str(),
                response,
                millis(self.clock.now())
            ])
            .map_err(classify)?;
        if updated == 0 {
            return Err(InboxError::NotClaimed { id: id.to_string() });
        }
        Ok(())
    }

    /// Deletes at most `limit` records past their retention; returns how
    /// many. Run it outside business transactions, in small batches.
    pub fn purge_expired(&self, conn: &Connection, limit: usize) -> Result<usize, InboxError> {
        conn.prepare_cached(
            "DELETE FROM idem_inbox WHERE rowid IN \
             (SELECT rowid FROM idem_inbox WHERE expires_at <= ?1 LIMIT ?2)",
        )
        .map_err(classify)?
        .execute(params![
            millis(self.clock.now()),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ])
        .map_err(classify)
    }

    /// Whether `id` has a live record (outside any transaction of yours).
    pub fn contains(&self, conn: &Connection, id: &RecordId) -> Result<bool, InboxError> {
        let found: Option<i64> = conn
            .prepare_cached("SELECT expires_at FROM idem_inbox WHERE scope = ?1 AND key = ?2")
            .map_err(classify)?
            .query_row(params![id.scope().as_str(), id.key().as_str()], |r| {
                r.get(0)
            })
            .optional()
            .map_err(classify)?;
        Ok(found.is_some_and(|e| e > millis(self.clock.now())))
    }
}
