//! Why a run could not be carried out, as opposed to the violations it
//! found.

use idem_testkit::ServerError;

/// Why a run could not be carried out (as opposed to a violation it found).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    /// The plan makes no sense; the message says why.
    #[error("invalid plan: {0}")]
    Plan(String),
    /// A server could not be started or set up.
    #[error("{what}")]
    Server {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: ServerError,
    },
    /// Anything else the harness itself needed failed.
    #[error("{0}")]
    Harness(String),
}

/// A failure of the harness itself, with what it was doing.
pub(crate) fn harness(what: impl std::fmt::Display) -> ChaosError {
    ChaosError::Harness(what.to_string())
}
