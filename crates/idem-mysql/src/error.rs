//! What MySQL's and MariaDB's errors mean for a record: transient (the
//! write did not land, or may not have; retried within the lease and read
//! back) or a definite refusal (docs/design.md §5.5), and whether a failed
//! batch was rolled back whole.

use idem::StoreError;
use mysql_async::Error;

/// Whether server error `code` is transient: the statement was not
/// applied, or may not have been, and running it again later can succeed.
/// These are [`StoreError::Unavailable`] (retried within the lease, read
/// back), never a definite refusal that would end a run whose effect
/// happened:
///
/// - 1205 lock wait timeout, 1213 deadlock, 1614 an XA branch rolled
///   back for a deadlock;
/// - 1040 too many connections, 1041/1037 out of memory, 1021 disk full,
///   1203 too many connections for the user;
/// - 1053 server shutdown in progress, 1077/1078/1079/1080 shutdown
///   steps, 1152/1158–1161 aborted or broken connections, 2006 server
///   gone away, 2013 lost connection (as the server reports them);
/// - 1290 and 1836 `--read-only` (a primary demoted by a failover), 1792
///   a read-only transaction;
/// - 1317 query interrupted, 1927 connection killed (MariaDB), 1969
///   (MariaDB) and 3024 (MySQL) statement time limits.
pub(crate) fn transient_code(code: u16) -> bool {
    matches!(
        code,
        1205 | 1213
            | 1614
            | 1040
            | 1041
            | 1037
            | 1021
            | 1203
            | 1053
            | 1077..=1080
            | 1152
            | 1158..=1161
            | 2006
            | 2013
            | 1290
            | 1836
            | 1792
            | 1317
            | 1927
            | 1969
            | 3024
    )
}

/// Whether `code` says the statement met another session's on the same
/// rows (a lock wait timeout, a deadlock): the server is up and the key
/// is busy, [`StoreError::contended`].
fn contention(code: u16) -> bool {
    matches!(code, 1205 | 1213 | 1614)
}

/// Maps a driver error: transient server errors ([`transient_code`]),
/// lost connections and I/O errors are [`StoreError::Unavailable`] (the
/// executor retries within the lease and fails closed); a missing table
/// or procedure says how to create it; anything else is a definite
/// refusal, [`StoreError::Backend`].
pub(crate) fn mysql_error(error: Error) -> StoreError {
    match &error {
        Error::Server(e) if contention(e.code) => StoreError::contended(error),
        Error::Server(e) if transient_code(e.code) => StoreError::Unavailable(Box::new(error)),
        // 1146 no such table, 1305 no such procedure.
        Error::Server(e) if matches!(e.code, 1146 | 1305) => StoreError::Backend(
            format!(
                "{} (run MySqlStore::setup, or apply idem_mysql::migrations())",
                e.message
            )
            .into(),
        ),
        Error::Server(_) | Error::Url(_) => StoreError::Backend(Box::new(error)),
        Error::Io(_) | Error::Driver(_) | Error::Other(_) => {
            StoreError::Unavailable(Box::new(error))
        }
    }
}

/// Whether a batch failed with `error` for what one of its items may have
/// caused alone, so that running the items one by one lets the others
/// through: the batch's transaction was rolled back whole (the procedures
/// roll back before they raise) for a lock or conflict on some row
/// ([`contention`]), or for one item's data (too long, out of range,
/// wrong value: 1264, 1265, 1292, 1366, 1406). Errors that hit every item
/// alike (the server going away, short of resources) fail the batch as
/// one.
pub(crate) fn one_item_may_cause(error: &StoreError) -> bool {
    let (StoreError::Unavailable(source) | StoreError::Backend(source)) = error else {
        return false;
    };
    let source = match source.downcast_ref::<idem::store::Contended>() {
        Some(contended) => &contended.0,
        None => source,
    };
    match source.downcast_ref::<Error>() {
        Some(Error::Server(e)) => {
            contention(e.code) || matches!(e.code, 1264 | 1265 | 1292 | 1366 | 1406)
        }
        _ => false,
    }
}

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be used. The message never contains the password.
    #[error("invalid MySQL URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server did not answer, or refused the connection.
    #[error("could not connect to MySQL at {url}")]
    Unavailable {
        /// The URL, password masked.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// Applying the migrations failed (often: no right to create tables or
    /// procedures in the database; apply [`migrations`](crate::migrations)
    /// as an owner instead and connect with `.setup(false)`).
    #[error("could not create idem's tables in database {database}")]
    Setup {
        /// The database.
        database: String,
        /// What the server said.
        #[source]
        source: StoreError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_conflicts_failovers_and_shortages_are_transient() {
        for code in [
            1205, 1213, 1614, 1040, 1041, 1021, 1053, 1079, 1159, 2006, 2013, 1290, 1836, 1317,
            1927, 1969, 3024,
        ] {
            assert!(transient_code(code), "{code}");
        }
        for code in [1062, 1406, 1146, 1064, 1045, 1366, 1048] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
