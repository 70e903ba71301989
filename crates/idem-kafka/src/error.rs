//! Why the consumer could not start or stopped.

use rdkafka::error::{KafkaError as RdKafkaError, RDKafkaErrorCode};

/// Why the consumer could not start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaConsumerError {
    /// A librdkafka client could not be created (a bad setting).
    #[error("cannot create the Kafka {which}")]
    Client {
        /// `consumer`, `producer` or `admin client`.
        which: &'static str,
        /// librdkafka's error.
        source: RdKafkaError,
    },
    /// A setting idem-kafka owns was given another value.
    #[error("{setting}={value} cannot be used: {why}")]
    Setting {
        /// The setting.
        setting: String,
        /// The value given.
        value: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// No topic to consume was given.
    #[error("no topic to consume")]
    NoTopics,
    /// The broker could not be asked (down, unreachable, timed out).
    #[error("{what}")]
    Broker {
        /// What was being done.
        what: String,
        /// librdkafka's error.
        source: RdKafkaError,
    },
    /// A topic does not exist.
    #[error("topic {topic:?} does not exist (broker says: {code})")]
    TopicMissing {
        /// The topic.
        topic: String,
        /// The broker's error code.
        code: RDKafkaErrorCode,
    },
    /// A dead-letter topic was missing and could not be created.
    #[error("dead-letter topic {topic:?} is missing and could not be created: {detail}")]
    DeadLetterTopic {
        /// The topic.
        topic: String,
        /// Why.
        detail: String,
    },
    /// Records expire before the broker stops redelivering.
    #[error(transparent)]
    Window(#[from] idem_consumer::WindowError),
}
