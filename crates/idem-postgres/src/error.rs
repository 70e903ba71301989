//! What PostgreSQL's errors mean for a record: transient (the write did
//! not land, or may not have; retried within the lease and read back) or a
//! definite refusal (docs/design.md §5.5), and whether a failed statement was
//! rolled back whole.

use deadpool_postgres::PoolError;
use idem::StoreError;
use tokio_postgres::error::{Severity, SqlState};

/// Whether SQLSTATE `code` is transient: the statement was not applied,
/// or may not have been, and running it again later can succeed. These
/// are [`StoreError::Unavailable`] (retried within the lease, read back),
/// never a definite refusal that would end a run whose effect happened:
///
/// - class 08: the connection failed;
/// - serialization failure (40001), deadlock (40P01), statement
///   completion unknown (40003), but not 40002 (a constraint found broken
///   at commit: a refusal);
/// - class 53: insufficient resources (disk, memory, connections);
/// - 55P03 `lock_not_available` (`lock_timeout`);
/// - 57014 `query_canceled` (`statement_timeout`, a cancel);
/// - 57P01–57P05: the server shutting down, starting, or cutting an idle
///   session;
/// - 25006 `read_only_sql_transaction`: a write to a primary demoted by a
///   failover;
/// - 25P03 `idle_in_transaction_session_timeout`;
/// - 58000 and 58030: system and I/O errors of the server.
pub(crate) fn transient_sqlstate(code: &str) -> bool {
    ["08", "53", "57P0"]
        .iter()
        .any(|class| code.starts_with(class))
        || matches!(
            code,
            "40001" | "40P01" | "40003" | "55P03" | "57014" | "25006" | "25P03" | "58000" | "58030"
        )
}

/// Whether SQLSTATE `code` says the statement met another session's on
/// the same rows: a serialization failure, a deadlock, a lock or
/// statement timeout (a statement that waited on a lock). The server is
/// up and the key is busy: [`StoreError::contended`], never a reason to
/// fail open.
fn contention(code: &str) -> bool {
    matches!(code, "40001" | "40P01" | "55P03" | "57014")
}

/// Maps a tokio-postgres error: transient SQLSTATEs
/// ([`transient_sqlstate`]), lost connections and servers going down are
/// [`StoreError::Unavailable`] (the executor retries within the lease and
/// fails closed); a missing table says how to create it; anything else is a
/// definite refusal, [`StoreError::Backend`].
pub(crate) fn pg_error(error: tokio_postgres::Error) -> StoreError {
    match error.code() {
        Some(state) if contention(state.code()) => StoreError::contended(error),
        Some(state) if transient_sqlstate(state.code()) => StoreError::Unavailable(Box::new(error)),
        Some(state) if *state == SqlState::UNDEFINED_TABLE => StoreError::Backend(
            format!(
                "{} (run PgStore::setup, or apply idem_postgres::migrations())",
                error
                    .as_db_error()
                    .map_or_else(|| error.to_string(), |d| d.message().to_owned())
            )
            .into(),
        ),
        Some(_) => StoreError::Backend(Box::new(error)),
        None if error.is_closed() || io_error(&error) => StoreError::Unavailable(Box::new(error)),
        None => StoreError::Backend(Box::new(error)),
    }
}

/// Whether a batch statement failed with `error` for what one of its
/// items may have caused alone, so that running the items one by one
/// lets the others through: PostgreSQL answered an ERROR (not FATAL or
/// PANIC, so the statement was rolled back whole and nothing of it
/// applied) for a lock or conflict on some row ([`contention`]), or for
/// one item's data (class 22, class 23, 54000 a value over a limit).
/// Errors that hit every item alike (the server going away, short of
/// resources, a demoted primary) fail the batch as one: running its items
/// one by one would only add load where it hurts.
pub(crate) fn one_item_may_cause(error: &StoreError) -> bool {
    let (StoreError::Unavailable(source) | StoreError::Backend(source)) = error else {
        return false;
    };
    let source = match source.downcast_ref::<idem::store::Contended>() {
        Some(contended) => &contended.0,
        None => source,
    };
    let Some(db) = source
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error)
    else {
        return false;
    };
    let code = db.code().code();
    db.parsed_severity() == Some(Severity::Error)
        && (contention(code) || code.starts_with("22") || code.starts_with("23") || code == "54000")
}

/// Maps a pool error: no connection in time, or none could be made, is
/// [`StoreError::Unavailable`].
pub(crate) fn pool_error(error: PoolError) -> StoreError {
    match error {
        PoolError::Backend(e) => pg_error(e),
        PoolError::Timeout(_) | PoolError::Closed | PoolError::NoRuntimeSpecified => {
            StoreError::Unavailable(Box::new(error))
        }
        PoolError::PostCreateHook(_) => StoreError::Backend(Box::new(error)),
    }
}

fn io_error(error: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be used. The message never contains the password.
    #[error("invalid PostgreSQL URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The schema is not 1 to 63 characters of `a-z 0-9 _` (not starting
    /// with a digit).
    #[error(
        "invalid schema {0:?}: use 1 to 63 characters of a-z 0-9 _, not starting with a digit"
    )]
    InvalidSchema(String),
    /// The server did not answer, or refused the connection.
    #[error("could not connect to PostgreSQL at {url}")]
    Unavailable {
        /// The URL, password masked.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// Applying the migrations failed (often: no right to create tables in
    /// the schema; apply [`migrations`](crate::migrations) as an owner instead and connect
    /// with `.setup(false)`).
    #[error("could not create idem's tables in schema {schema}")]
    Setup {
        /// The schema.
        schema: String,
        /// What the server said.
        #[source]
        source: StoreError,
    },
}

#[cfg(test)]
mod tests {
    use super::transient_sqlstate;

    #[test]
    fn timeouts_conflicts_failovers_and_shortages_are_transient() {
        for code in [
            "08006", "08P01", "40001", "40P01", "40003", "53000", "53100", "53200", "53300",
            "53400", "55P03", "57014", "57P01", "57P02", "57P03", "57P04", "57P05", "25006",
            "25P03", "58000", "58030",
        ] {
            assert!(transient_sqlstate(code), "{code}");
        }
        for code in [
            "23505", "22001", "42P01", "54000", "XX001", "22P02", "42501",
        ] {
            assert!(!transient_sqlstate(code), "{code}");
        }
    }
}
