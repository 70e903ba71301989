//! How the inbox's statements run on either driver: a private trait, so
//! the public traits built on it are sealed.

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
