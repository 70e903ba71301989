//! The transactional inbox: the dedup row is written **inside your own
//! transaction**, so it commits or rolls back together with your business
//! writes. No lease is needed. A concurrent duplicate's insert waits on the
//! primary key until the first transaction ends, then sees its committed
//! row (or, if it rolled back, goes ahead as new). A crash can never leave
//! the business write without the dedup row, or the other way round.
//!
//! ```no_run
//! # async fn demo(pool: &mysql_async::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! use idem::RecordId;
//! use idem_mysql::inbox::{Inbox, InboxOutcome};
//! use mysql_async::prelude::Queryable;
//! use mysql_async::TxOpts;
//! use std::time::Duration;
//!
//! let inbox = Inbox::new(Duration::from_secs(7 * 24 * 3600));
//! inbox.setup(&mut pool.get_conn().await?).await?; // or apply idem_mysql::migrations()
//!
//! let id = RecordId::parse("payments", "msg-17")?;
//! let mut conn = pool.get_conn().await?;
//! let mut tx = conn.start_transaction(TxOpts::default()).await?;
//! match inbox.claim(&mut tx, &id, None).await? {
//!     InboxOutcome::New => {
//!         tx.query_drop("UPDATE accounts SET balance = balance + 1250 WHERE id = 7").await?;
//!         inbox.set_response(&mut tx, &id, b"credited").await?;
//!         tx.commit().await?; // the credit and the dedup row, or neither
//!     }
//!     InboxOutcome::Duplicate { .. } => {} // done before: ack and move on
//!     InboxOutcome::Mismatch => {}         // same id, different message: dead-letter it
//! }
//! # Ok(()) }
//! ```
//!
//! Any isolation level works: the claim reads the row with a locking read,
//! which sees the latest committed row under `REPEATABLE READ` too. Under
//! `REPEATABLE READ` (the server's default) a claim may take gap locks and
//! meet another in a deadlock; the server then rolls the transaction back
//! ([`InboxError::is_retryable`]) and running it again finds the
//! duplicate.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Value;

use idem::{Fingerprint, RecordId};

use idem::store::TokenMint;

use crate::encode::ms;
use crate::error::transient_code;
use crate::schema;
use crate::sql::text;
use crate::store::id_params;

pub use idem::InboxOutcome;

/// Why an inbox operation failed. Roll the transaction back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The inbox table is missing: run [`Inbox::setup`] (or apply
    /// [`crate::migrations`]) first.
    #[error("the idem_inbox table does not exist: run Inbox::setup or apply idem_mysql::migrations() first")]
    NotSetUp,
    /// [`Inbox::set_response`] for a key this transaction has not claimed,
    /// or whose response is already set (the first is never overwritten).
    #[error("set_response for {id}: no live claim without a response")]
    NotClaimed {
        /// The key, as `scope/key`.
        id: String,
    },
    /// Any other error from the server or the driver; see
    /// [`is_retryable`](Self::is_retryable).
    #[error("MySQL error in the inbox")]
    MySql(#[source] mysql_async::Error),
}

impl InboxError {
    /// Whether running the whole transaction again may succeed: the
    /// store's transient server errors (a deadlock, a lock wait timeout, a
    /// failover, a server shutting down or short of resources), or a lost
    /// connection.
    pub fn is_retryable(&self) -> bool {
        match self {
            InboxError::MySql(mysql_async::Error::Server(e)) => transient_code(e.code),
            InboxError::MySql(e) => e.is_fatal(),
            _ => false,
        }
    }

    fn from_driver(error: mysql_async::Error) -> Self {
        match &error {
            mysql_async::Error::Server(e) if e.code == 1146 => InboxError::NotSetUp,
            _ => InboxError::MySql(error),
        }
    }
}

/// An inbox row as the claim reads it: its claim, fingerprint and
/// response.
type InboxRow = (Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

/// Dedup rows inside the caller's transactions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Inbox {
    retention: Duration,
    claims: Arc<TokenMint>,
    claim: String,
    read: String,
    respond: String,
    purge: String,
}

impl Inbox {
    /// An inbox that keeps rows for `retention` (longer than any
    /// redelivery window of the source), in the connection's database.
    pub fn new(retention: Duration) -> Self {
        Self {
            retention,
            claims: Arc::new(TokenMint::new()),
            claim: text(include_str!("../sql/inbox_claim.sql")),
            read: text(include_str!("../sql/inbox_read.sql")),
            respond: text(include_str!("../sql/inbox_respond.sql")),
            purge: text(include_str!("../sql/inbox_purge.sql")),
        }
    }

    /// Applies idem's migrations (the store's and the inbox's tables) in
    /// the connection's database. Outside a transaction: MySQL commits
    /// each table it creates.
    pub async fn setup(&self, conn: &mut impl Queryable) -> Result<(), InboxError> {
        schema::apply(conn).await.map_err(InboxError::MySql)?;
        Ok(())
    }

    /// Claims `id` inside `tx`: [`InboxOutcome::New`] if this is the first
    /// time (do the work in `tx`, then commit), `Duplicate` with the
    /// recorded response if an earlier transaction committed it, or
    /// `Mismatch` if it did so with another fingerprint. A row past its
    /// retention counts as absent.
    pub async fn claim(
        &self,
        tx: &mut impl Queryable,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
    ) -> Result<InboxOutcome, InboxError> {
        // A value no other claim writes.
        let mine = self.claims.next().as_u128().to_be_bytes();
        let [scope, key] = id_params(id);
        let fp = fingerprint.map_or(Value::NULL, |f| Value::Bytes(f.as_bytes().to_vec()));
        tx.exec_drop(
            &self.claim,
            vec![
                scope,
                key,
                Value::Bytes(mine.to_vec()),
                fp,
                Value::Int(ms(self.retention)),
            ],
        )
        .await
        .map_err(InboxError::from_driver)?;
        let row: Option<InboxRow> = tx
            .exec_first(&self.read, id_params(id).to_vec())
            .await
            .map_err(InboxError::from_driver)?;
        let Some((claim, stored, response)) = row else {
            return Err(InboxError::MySql(mysql_async::Error::Other(
                format!("the inbox row of {id} vanished inside the transaction").into(),
            )));
        };
        Ok(if claim == mine {
            InboxOutcome::New
        } else if stored.as_deref() != fingerprint.as_ref().map(|f| &f.as_bytes()[..]) {
            InboxOutcome::Mismatch
        } else {
            InboxOutcome::Duplicate { response }
        })
    }

    /// Records the response of a claim made in `tx`, so duplicates get it.
    /// Never overwrites: a second call for the same claim is
    /// [`InboxError::NotClaimed`].
    pub async fn set_response(
        &self,
        tx: &mut impl Queryable,
        id: &RecordId,
        response: &[u8],
    ) -> Result<(), InboxError> {
        let mut params = vec![Value::Bytes(response.to_vec())];
        params.extend(id_params(id));
        if changed(tx, &self.respond, params).await? == 1 {
            Ok(())
        } else {
            Err(InboxError::NotClaimed { id: id.to_string() })
        }
    }

    /// Deletes at most `limit` rows past their retention, oldest first;
    /// how many. Run it on a connection outside any transaction, from time
    /// to time (every few minutes for a busy inbox).
    pub async fn purge_expired(
        &self,
        conn: &mut impl Queryable,
        limit: usize,
    ) -> Result<usize, InboxError> {
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let purged = changed(conn, &self.purge, vec![Value::UInt(limit)]).await?;
        Ok(usize::try_from(purged).unwrap_or(usize::MAX))
    }
}

/// Runs a write on `conn`; the number of rows it changed.
async fn changed(
    conn: &mut impl Queryable,
    sql: &str,
    params: Vec<Value>,
) -> Result<u64, InboxError> {
    let result = conn
        .exec_iter(sql, params)
        .await
        .map_err(InboxError::from_driver)?;
    let n = result.affected_rows();
    result
        .drop_result()
        .await
        .map_err(InboxError::from_driver)?;
    Ok(n)
}
