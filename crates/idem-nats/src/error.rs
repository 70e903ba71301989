//! Why the consumer could not start or stopped.

use std::error::Error as StdError;

/// Why the consumer could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// The server could not be reached.
    #[error("cannot connect to NATS at {url}")]
    Connect {
        /// The URL, password masked.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// A JetStream request failed (stream missing, consumer refused).
    #[error("{what}")]
    JetStream {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: async_nats::Error,
    },
    /// The configuration would lose or duplicate messages, or is invalid.
    #[error("invalid JetStream consumer configuration: {0}")]
    Config(String),
    /// Record retention or the heartbeat does not cover the server's
    /// windows.
    #[error(transparent)]
    Window(#[from] idem_consumer::WindowError),
    /// The message stream ended or failed while consuming.
    #[error("consuming {consumer:?} failed: {reason}")]
    Consume {
        /// The durable consumer.
        consumer: String,
        /// What happened.
        reason: String,
    },
}

pub(crate) fn js_error(what: impl Into<String>) -> impl FnOnce(async_nats::Error) -> NatsError {
    let what = what.into();
    move |source| NatsError::JetStream { what, source }
}

pub(crate) fn boxed<E: StdError + Send + Sync + 'static>(e: E) -> async_nats::Error {
    Box::new(e)
}
