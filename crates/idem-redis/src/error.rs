//! Why a store could not be set up, and how Redis errors become
//! [`StoreError`]s.

use idem::StoreError;
use redis::{ErrorKind, RedisError};

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be used. The message never contains the password.
    #[error("invalid Redis URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting cannot be used; the message says which and why.
    #[error("invalid Redis store setting: {0}")]
    InvalidSetting(String),
    /// The namespace is not 1 to 64 characters of `A-Z a-z 0-9 _ . : -`.
    #[error("invalid namespace {0:?}: use 1 to 64 characters of A-Z a-z 0-9 _ . : -")]
    InvalidNamespace(String),
    /// The server (or no Cluster node) answered.
    #[error("could not connect to Redis at {url}")]
    Unavailable {
        /// The URL, password masked.
        url: String,
        /// What the client reported.
        #[source]
        source: redis::RedisError,
    },
}

/// A script's refusal of a record it cannot read (an error starting
/// `DAMAGED`, see `lua/prelude.lua`) as [`StoreError::Corrupt`] naming
/// `id`; any other error as it is. The record is left untouched.
pub(crate) fn damaged(id: &(impl std::fmt::Display + ?Sized), error: StoreError) -> StoreError {
    const MARK: &str = "DAMAGED";
    let StoreError::Backend(source) = &error else {
        return error;
    };
    let text = source.to_string();
    match text.find(MARK) {
        Some(at) => StoreError::Corrupt {
            id: id.to_string(),
            reason: text[at + MARK.len()..]
                .trim_start_matches([':', ' '])
                .to_owned(),
        },
        None => error,
    }
}

/// An I/O error saying what timed out.
pub(crate) fn timeout_error(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("timed out {what}"),
    ))
}

/// Server error codes after which the command did not run (or may not
/// have) and a later try can succeed: a script running too long (`BUSY`),
/// a server loading its data, a replica or a demoted master (`READONLY`),
/// a master down or a Cluster resharding or failing (`MASTERDOWN`,
/// `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`, `ASK`), too few replicas for
/// `min-replicas-to-write` (`NOREPLICAS`), and memory full under
/// `maxmemory` (`OOM`, resource exhaustion, docs/design.md §5.5).
const TRANSIENT_CODES: &[&str] = &[
    "BUSY",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "NOREPLICAS",
    "OOM",
];

/// Whether a server error code is transient ([`TRANSIENT_CODES`]).
pub(crate) fn transient_code(code: &str) -> bool {
    TRANSIENT_CODES.contains(&code)
}

/// Whether the error means the server (or the Cluster) could not serve
/// the request, or its answer was lost: not reachable, timed out, a reply
/// cut off or garbled on the way (the command may have run: it is read
/// back, never taken as a refusal), or a transient error code
/// ([`TRANSIENT_CODES`]).
pub(crate) fn is_unavailable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound | ErrorKind::Parse
        )
        || error.code().is_some_and(transient_code)
}

/// Maps a `redis` error to the store's error: unreachable servers and
/// transient errors are [`StoreError::Unavailable`] (the executor retries
/// within the lease and fails closed), anything else is a definite
/// refusal, [`StoreError::Backend`].
pub(crate) fn store_error(error: RedisError) -> StoreError {
    if is_unavailable(&error) {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Backend(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::transient_code;

    #[test]
    fn busy_loading_failovers_reshards_and_shortages_are_transient() {
        for code in [
            "BUSY",
            "LOADING",
            "READONLY",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "MOVED",
            "ASK",
            "NOREPLICAS",
            "OOM",
        ] {
            assert!(transient_code(code), "{code}");
        }
        for code in [
            "ERR",
            "WRONGTYPE",
            "NOSCRIPT",
            "NOPERM",
            "CROSSSLOT",
            "EXECABORT",
        ] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
