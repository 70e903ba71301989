//! Why the consumer could not start or stopped, and which broker errors
//! are transient.

/// Why the consumer could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitError {
    /// The broker could not be reached or refused the login.
    #[error("cannot connect to RabbitMQ at {url}")]
    Connect {
        /// The URL, password masked.
        url: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// Declaring a queue failed, e.g. it exists with other arguments.
    #[error("cannot declare queue {queue:?}")]
    Declare {
        /// The queue.
        queue: String,
        /// The broker's reason.
        #[source]
        source: lapin::Error,
    },
    /// The configuration is refused (name, prefetch, retry delays).
    #[error("invalid RabbitMQ consumer configuration: {0}")]
    Config(String),
    /// Record retention does not cover the redelivery window.
    #[error(transparent)]
    Window(#[from] idem_consumer::WindowError),
    /// The channel or connection failed while consuming.
    #[error("RabbitMQ channel failed while consuming {queue:?}")]
    Consume {
        /// The queue.
        queue: String,
        /// The client's error.
        #[source]
        source: lapin::Error,
    },
    /// The broker ended the consumer (connection lost, queue deleted).
    /// In-flight deliveries were settled or left to the broker.
    #[error("the broker ended the consumer of {queue:?}")]
    Ended {
        /// The queue.
        queue: String,
    },
}

/// Whether trying again may get past `error`: not for the broker's
/// refusals (access refused 403, not found 404, precondition failed 406,
/// not allowed 530) or a failed login.
pub(crate) fn transient(error: &lapin::Error) -> bool {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(refusal) => {
            !matches!(refusal.kind().get_id(), 403 | 404 | 406 | 530)
        }
        lapin::ErrorKind::AuthProviderError(_) | lapin::ErrorKind::InvalidProtocolVersion(_) => {
            false
        }
        _ => true,
    }
}
