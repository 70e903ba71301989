//! How the inbox's statements run on either driver: a private trait, so
//! the public traits built on it are sealed.

use std::future::Future;

use tokio_postgres::types::{ToSql, Type};

/// A statement parameter, bound the same way by either driver.
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Text(&'a str),
    Bytes(Option<&'a [u8]>),
    Float(f64),
    Int(i64),
}

/// An error from either driver, before it becomes an [`InboxError`](super::InboxError).
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

impl Param<'_> {
    fn value(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Text(v) => v,
            Param::Bytes(v) => v,
            Param::Float(v) => v,
            Param::Int(v) => v,
        }
    }

    fn pg_type(&self) -> Type {
        match self {
            Param::Text(_) => Type::TEXT,
            Param::Bytes(_) => Type::BYTEA,
            Param::Float(_) => Type::FLOAT8,
            Param::Int(_) => Type::INT8,
        }
    }
}

/// The parameters with their types, for tokio-postgres' `*_typed` calls:
/// each statement is then one round trip (no prepare and close around it).
fn typed<'a>(params: &'a [Param<'a>]) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params.iter().map(|p| (p.value(), p.pg_type())).collect()
}

/// The parameters for a prepared statement, which knows their types.
fn untyped<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(Param::value).collect()
}

/// The two `bytea` columns of `row`, if there is one.
fn stored(row: Option<tokio_postgres::Row>) -> Result<Stored, DbError> {
    row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .transpose()
        .map_err(DbError::Postgres)
}

/// `Run` for tokio-postgres' own client and transaction: each statement
/// sent with its parameter types, in one round trip (they keep no cache of
/// prepared statements to reuse).
macro_rules! run_typed {
    ($($ty:ty),* $(,)?) => {$(
        impl Run for &$ty {
            async fn execute(
                &mut self,
                sql: &std::sync::Arc<str>,
                params: &[Param<'_>],
            ) -> Result<u64, DbError> {
                self.execute_typed(sql, &typed(params))
                    .await
                    .map_err(DbError::Postgres)
            }

            async fn read(
                &mut self,
                sql: &std::sync::Arc<str>,
                params: &[Param<'_>],
            ) -> Result<Stored, DbError> {
                let row = self.query_typed_opt(sql, &typed(params)).await;
                stored(row.map_err(DbError::Postgres)?)
            }
        }
    )*};
}

/// `Run` for deadpool-postgres' pooled client and transaction: statements
/// prepared once per connection, in the pool's statement cache.
macro_rules! run_cached {
    ($($ty:ty),* $(,)?) => {$(
        impl Run for &$ty {
            async fn execute(
                &mut self,
                sql: &std::sync::Arc<str>,
                params: &[Param<'_>],
            ) -> Result<u64, DbError> {
                let statement = self.prepare_cached(sql).await.map_err(DbError::Postgres)?;
                (**self)
                    .execute(&statement, &untyped(params))
                    .await
                    .map_err(DbError::Postgres)
            }

            async fn read(
                &mut self,
                sql: &std::sync::Arc<str>,
                params: &[Param<'_>],
            ) -> Result<Stored, DbError> {
                let statement = self.prepare_cached(sql).await.map_err(DbError::Postgres)?;
                let row = (**self).query_opt(&statement, &untyped(params)).await;
                stored(row.map_err(DbError::Postgres)?)
            }
        }
    )*};
}

run_typed!(tokio_postgres::Client, tokio_postgres::Transaction<'_>);
run_cached!(
    deadpool_postgres::Object,
    deadpool_postgres::Transaction<'_>
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
        async fn execute(&mut self, sql: &Arc<str>, params: &[Param<'_>]) -> Result<u64, DbError> {
            let done = bound(sql, params).execute(&mut **self).await;
            done.map(|d| d.rows_affected()).map_err(DbError::Sqlx)
        }

        async fn read(&mut self, sql: &Arc<str>, params: &[Param<'_>]) -> Result<Stored, DbError> {
            let row = bound(sql, params).fetch_optional(&mut **self).await;
            columns(row.map_err(DbError::Sqlx)?)
        }
    }

    impl Run for &mut Transaction<'_, Postgres> {
        async fn execute(&mut self, sql: &Arc<str>, params: &[Param<'_>]) -> Result<u64, DbError> {
            let mut connection: &mut PgConnection = self;
            connection.execute(sql, params).await
        }

        async fn read(&mut self, sql: &Arc<str>, params: &[Param<'_>]) -> Result<Stored, DbError> {
            let mut connection: &mut PgConnection = self;
            connection.read(sql, params).await
        }
    }

    impl InboxTransaction for &mut Transaction<'_, Postgres> {}
    impl InboxExecutor for &mut PgConnection {}
}
