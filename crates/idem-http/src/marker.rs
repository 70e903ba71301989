//! Markers an inner service uses to tell the layer what its failure means
//! for the key: whether the request may have been acted on.

use std::error::Error as StdError;

use idem::BoxError;

/// A marker an inner service sets on its own error response (as a
/// response extension) when the request may have reached the upstream but
/// the upstream's response was lost: a timeout after the request was sent,
/// a connection reset mid-response. The layer then does not release the
/// key (a retry could run the request a second time): it records the key
/// as failed with an unknown outcome, passes this response on, and answers
/// later requests with that key 422 `outcome-unknown` until an operator
/// checks the upstream and releases the key (`idem release SCOPE KEY`).
/// The `idem proxy` gateway sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeUnknown;

/// An error an inner service returns (or puts in its error's `source()`
/// chain) when it failed **before** acting on the request: it could not
/// connect, a limit refused the request before it was passed on. The
/// layer then releases the key, so the client may retry.
///
/// Any other error from the inner service may come after the request was
/// acted on (a timeout layer inside, a connection lost mid-response): the
/// key is then kept as failed with an unknown outcome, answered 502 now and
/// 422 `outcome-unknown` later, never run a second time.
///
/// ```
/// use idem_http::NotExecuted;
/// let refused = NotExecuted::new(std::io::Error::other("connection refused"));
/// assert_eq!(refused.to_string(), "not executed");
/// assert_eq!(idem::error_chain(&refused), "not executed: connection refused");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("not executed")]
pub struct NotExecuted {
    #[source]
    source: BoxError,
}

impl NotExecuted {
    /// Marks `source` as a failure before anything was done.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

/// Whether `error` or any of its sources is a [`NotExecuted`].
pub(crate) fn is_not_executed(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<NotExecuted>() {
            return true;
        }
        current = e.source();
    }
    false
}
