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

use crate::row::ms;
use crate::schema;
use run::{DbError, Param};

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
    /// Any other error from sqlx; see [`is_retryable`](Self::is_retryable).
    #[cfg(feature = "sqlx")]
    #[error("sqlx error in the inbox")]
    Sqlx(#[source] sqlx::Error),
}

impl InboxError {
    /// Whether running the whole transaction again may succeed: a
    /// serialization failure, a deadlock, or a lost connection.
    pub fn is_retryable(&self) -> bool {
        let retryable_state = |code: &str| {
            code == SqlState::T_R_SERIALIZATION_FAILURE.code()
                || code == SqlState::T_R_DEADLOCK_DETECTED.code()
                || code.starts_with("08")
        };
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
    sql: InboxSql,
}

/// The inbox's statements, with the schema filled in.
#[derive(Debug, Clone)]
struct InboxSql {
    insert: Arc<str>,
    renew: Arc<str>,
    read: Arc<str>,
    respond: Arc<str>,
    purge: Arc<str>,
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
        let r = |sql: &str| Arc::from(schema::render(sql, schema));
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
            .map_err(|e| self.error(DbError::Postgres(e)))?;
        Ok(())
    }

    fn error(&self, e: DbError) -> InboxError {
        if e.code().as_deref() == Some(SqlState::UNDEFINED_TABLE.code()) {
            return InboxError::NotSetUp {
                table: format!("{}.idem_inbox", self.schema),
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
        loop {
            for sql in [&self.sql.insert, &self.sql.renew] {
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

mod run {
    use std::future::Future;

    use tokio_postgres::types::ToSql;
    use tokio_postgres::GenericClient;

    /// A statement parameter, bound the same way by either driver.
    #[derive(Debug, Clone, Copy)]
    pub enum Param<'a> {
        Text(&'a str),
        Bytes(Option<&'a [u8]>),
        Float(f64),
        Int(i64),
    }

    /// An error from either driver, before it becomes an [`InboxError`].
    #[derive(Debug)]
    pub enum DbError {
        Postgres(tokio_postgres::Error),
        #[cfg(feature = "sqlx")]
        Sqlx(sqlx::Error),
    }

    impl DbError {
        /// The SQLSTATE, when the server sent one.
        pub fn code(&self) -> Option<String> {
            match self {
                DbError::Postgres(e) => e.code().map(|c| c.code().to_owned()),
                #[cfg(feature = "sqlx")]
                DbError::Sqlx(e) => e
                    .as_database_error()
                    .and_then(|d| d.code())
                    .map(|c| c.into_owned()),
            }
        }
    }

    /// A live row's stored fingerprint and response, if there is one.
    pub(super) type Stored = Option<(Option<Vec<u8>>, Option<Vec<u8>>)>;

    /// The two statement shapes the inbox runs. Private, so the public
    /// traits built on it are sealed.
    pub trait Run: Send {
        /// Runs `sql`; how many rows it wrote.
        fn execute(
            &mut self,
            sql: &std::sync::Arc<str>,
            params: &[Param<'_>],
        ) -> impl Future<Output = Result<u64, DbError>> + Send;

        /// Runs `sql`; its first row's two `bytea` columns.
        fn read(
            &mut self,
            sql: &std::sync::Arc<str>,
            params: &[Param<'_>],
        ) -> impl Future<Output = Result<Stored, DbError>> + Send;
    }

    fn pg<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
        params
            .iter()
            .map(|p| -> &(dyn ToSql + Sync) {
                match p {
                    Param::Text(v) => v,
                    Param::Bytes(v) => v,
                    Param::Float(v) => v,
                    Param::Int(v) => v,
                }
            })
            .collect()
    }

    async fn pg_execute(
        client: &(impl GenericClient + Sync),
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, DbError> {
        client
            .execute(sql, &pg(params))
            .await
            .map_err(DbError::Postgres)
    }

    async fn pg_read(
        client: &(impl GenericClient + Sync),
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Stored, DbError> {
        let Some(row) = client
            .query_opt(sql, &pg(params))
            .await
            .map_err(DbError::Postgres)?
        else {
            return Ok(None);
        };
        Ok(Some((
            row.try_get(0).map_err(DbError::Postgres)?,
            row.try_get(1).map_err(DbError::Postgres)?,
        )))
    }

    /// `Run` for types that are, or dereference to, a tokio-postgres
    /// client or transaction (`$pg`).
    macro_rules! run_on_tokio_postgres {
        ($($ty:ty => $pg:ty),* $(,)?) => {$(
            impl Run for &$ty {
                async fn execute(
                    &mut self,
                    sql: &std::sync::Arc<str>,
                    params: &[Param<'_>],
                ) -> Result<u64, DbError> {
                    let client: &$pg = self;
                    pg_execute(client, sql, params).await
                }

                async fn read(
                    &mut self,
                    sql: &std::sync::Arc<str>,
                    params: &[Param<'_>],
                ) -> Result<Stored, DbError> {
                    let client: &$pg = self;
                    pg_read(client, sql, params).await
                }
            }
        )*};
    }

    run_on_tokio_postgres!(
        tokio_postgres::Client => tokio_postgres::Client,
        tokio_postgres::Transaction<'_> => tokio_postgres::Transaction<'_>,
        deadpool_postgres::Object => tokio_postgres::Client,
        deadpool_postgres::Transaction<'_> => tokio_postgres::Transaction<'_>,
    );

    #[cfg(feature = "sqlx")]
    mod sqlx_run {
        use std::sync::Arc;

        use sqlx::postgres::{PgArguments, PgConnection, PgRow};
        use sqlx::query::Query;
        use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

        use super::super::{InboxExecutor, InboxTransaction};
        use super::{DbError, Param, Run, Stored};

        fn bound<'q>(sql: &Arc<str>, params: &[Param<'q>]) -> Query<'q, Postgres, PgArguments> {
            params.iter().fold(
                sqlx::query(AssertSqlSafe(Arc::clone(sql))),
                |q, p| match *p {
                    Param::Text(v) => q.bind(v),
                    Param::Bytes(v) => q.bind(v),
                    Param::Float(v) => q.bind(v),
                    Param::Int(v) => q.bind(v),
                },
            )
        }

        fn columns(row: Option<PgRow>) -> Result<Stored, DbError> {
            row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .transpose()
                .map_err(DbError::Sqlx)
        }

        impl Run for &mut PgConnection {
            async fn execute(
                &mut self,
                sql: &Arc<str>,
                params: &[Param<'_>],
            ) -> Result<u64, DbError> {
                let done = bound(sql, params).execute(&mut **self).await;
                done.map(|d| d.rows_affected()).map_err(DbError::Sqlx)
            }

            async fn read(
                &mut self,
                sql: &Arc<str>,
                params: &[Param<'_>],
            ) -> Result<Stored, DbError> {
                let row = bound(sql, params).fetch_optional(&mut **self).await;
                columns(row.map_err(DbError::Sqlx)?)
            }
        }

        impl Run for &mut Transaction<'_, Postgres> {
            async fn execute(
                &mut self,
                sql: &Arc<str>,
                params: &[Param<'_>],
            ) -> Result<u64, DbError> {
                let mut connection: &mut PgConnection = self;
                connection.execute(sql, params).await
            }

            async fn read(
                &mut self,
                sql: &Arc<str>,
                params: &[Param<'_>],
            ) -> Result<Stored, DbError> {
                let mut connection: &mut PgConnection = self;
                connection.read(sql, params).await
            }
        }

        impl InboxTransaction for &mut Transaction<'_, Postgres> {}
        impl InboxExecutor for &mut PgConnection {}
    }
}
