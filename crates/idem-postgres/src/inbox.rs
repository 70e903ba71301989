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
#![doc = include_str!("../docs/natural.md")]

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, Transaction};

use idem::{Fingerprint, RecordId};

use crate::row::ms;
use crate::schema;

pub use idem::InboxOutcome;

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
}

impl InboxError {
    /// Whether running the whole transaction again may succeed: a
    /// serialization failure, a deadlock, or a lost connection.
    pub fn is_retryable(&self) -> bool {
        match self {
            InboxError::Postgres(e) => match e.code() {
                Some(state) => {
                    *state == SqlState::T_R_SERIALIZATION_FAILURE
                        || *state == SqlState::T_R_DEADLOCK_DETECTED
                        || state.code().starts_with("08")
                }
                None => e.is_closed(),
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
    sql: InboxSql,
}

/// The inbox's statements, with the schema filled in.
#[derive(Debug, Clone)]
struct InboxSql {
    insert: String,
    renew: String,
    read: String,
    respond: String,
    purge: String,
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
        assert!(
            schema::valid_schema(schema),
            "invalid schema name {schema:?}: use 1 to 63 characters of a-z 0-9 _"
        );
        let r = |sql: &str| schema::render(sql, schema);
        Self {
            schema: schema.to_owned(),
            retention,
            sql: InboxSql {
                insert: r(include_str!("../sql/inbox_claim.sql")),
                renew: r(include_str!("../sql/inbox_renew.sql")),
                read: r(include_str!("../sql/inbox_read.sql")),
                respond: r(include_str!("../sql/inbox_respond.sql")),
                purge: r(include_str!("../sql/inbox_purge.sql")),
            },
        }
    }

    /// Applies idem's migrations (the store's and the inbox's tables) in
    /// this inbox's schema.
    pub async fn setup(&self, client: &mut Client) -> Result<(), InboxError> {
        schema::apply(client, &self.schema)
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }

    fn error(&self, e: tokio_postgres::Error) -> InboxError {
        if e.code() == Some(&SqlState::UNDEFINED_TABLE) {
            InboxError::NotSetUp {
                table: format!("{}.idem_inbox", self.schema),
            }
        } else {
            InboxError::Postgres(e)
        }
    }

    /// Records `id` as processed by this transaction if it is new (absent
    /// or past its retention). Call it first in the transaction: a
    /// concurrent duplicate then waits here until this transaction ends.
    pub async fn claim(
        &self,
        tx: &Transaction<'_>,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
    ) -> Result<InboxOutcome, InboxError> {
        let fp = fingerprint.map(|f| f.as_bytes().to_vec());
        let (scope, key, keep) = (id.scope().as_str(), id.key().as_str(), ms(self.retention));
        loop {
            for sql in [&self.sql.insert, &self.sql.renew] {
                let rows = tx
                    .query(sql.as_str(), &[&scope, &key, &fp, &keep])
                    .await
                    .map_err(|e| self.error(e))?;
                if !rows.is_empty() {
                    return Ok(InboxOutcome::New);
                }
            }
            let Some(row) = tx
                .query_opt(self.sql.read.as_str(), &[&scope, &key])
                .await
                .map_err(|e| self.error(e))?
            else {
                // Purged or expired between the statements: try again.
                continue;
            };
            let stored: Option<Vec<u8>> = row.try_get(0).map_err(InboxError::Postgres)?;
            if stored != fp {
                return Ok(InboxOutcome::Mismatch);
            }
            return Ok(InboxOutcome::Duplicate {
                response: row.try_get(1).map_err(InboxError::Postgres)?,
            });
        }
    }

    /// Stores the response duplicates will see, in the same transaction as
    /// the claim. A response already stored is never overwritten.
    pub async fn set_response(
        &self,
        tx: &Transaction<'_>,
        id: &RecordId,
        response: &[u8],
    ) -> Result<(), InboxError> {
        let updated = tx
            .execute(
                self.sql.respond.as_str(),
                &[&id.scope().as_str(), &id.key().as_str(), &response],
            )
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
    pub async fn purge_expired(
        &self,
        client: &impl GenericClient,
        limit: usize,
    ) -> Result<u64, InboxError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        client
            .execute(self.sql.purge.as_str(), &[&limit])
            .await
            .map_err(|e| self.error(e))
    }
}
