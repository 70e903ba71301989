//! Why the consumer could not start or stopped.

use std::error::Error as StdError;

use aws_sdk_sqs::error::DisplayErrorContext;

/// Why the consumer could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// An SQS request failed (queue missing, access denied, unreachable).
    #[error("{what}: {detail}")]
    Request {
        /// What was being done.
        what: String,
        /// SQS's or the client's error.
        detail: String,
    },
    /// The configuration would lose or duplicate messages, or is invalid.
    #[error("invalid SQS consumer configuration: {0}")]
    Config(String),
    /// Record retention or the heartbeat does not cover the queue's
    /// windows.
    #[error(transparent)]
    Window(#[from] idem_consumer::WindowError),
    /// The message stream ended while consuming.
    #[error("consuming {queue:?} failed: {reason}")]
    Consume {
        /// The queue.
        queue: String,
        /// What happened.
        reason: String,
    },
}

pub(crate) fn request_error<E: StdError + 'static>(
    what: impl Into<String>,
) -> impl FnOnce(E) -> SqsError {
    let what = what.into();
    move |e| SqsError::Request {
        what,
        detail: error_text(e),
    }
}

/// An SDK error with its sources, as one line.
pub(crate) fn error_text<E: StdError>(e: E) -> String {
    DisplayErrorContext(e).to_string()
}
