//! The outbox's last hop to Kafka: [`KafkaSender`].

use std::time::Duration;

use idem::outbox::{Message, SendError, SendFuture, Sender};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

/// How long a record may take to be acknowledged before the send counts
/// as unavailable (and is tried again, under the same id).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(15);

/// Sends a run's outbox messages ([`idem::outbox`]) to Kafka with an
/// idempotent producer (`enable.idempotence`, `acks=all`: the producer's
/// own retries never write a record twice): the destination is the topic,
/// the message's id is the record key (so a message's copies land on one
/// partition) and the `Idempotency-Key` header, which an idem consumer
/// downstream keys on — a message sent again after a lost
/// acknowledgement, by another producer session, is answered there.
/// A send is confirmed when the record is acknowledged by all in-sync
/// replicas.
///
/// ```no_run
/// let sender = idem_kafka::KafkaSender::new("127.0.0.1:9092")?;
/// let idem = idem::Idempotency::builder(idem::MemoryStore::new())
///     .outbox(sender)
///     .build()?;
/// # let _ = idem;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct KafkaSender {
    producer: FutureProducer,
}

impl std::fmt::Debug for KafkaSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSender").finish_non_exhaustive()
    }
}

impl KafkaSender {
    /// An idempotent producer for the cluster at `bootstrap` (a
    /// `host:port` list).
    pub fn new(bootstrap: &str) -> Result<Self, KafkaError> {
        Self::from_config(ClientConfig::new().set("bootstrap.servers", bootstrap))
    }

    /// A producer from `config`, with `enable.idempotence` and `acks=all`
    /// unless `config` sets them (a broker without idempotent producers
    /// needs `enable.idempotence=false`; then a retry of the producer's own
    /// may write a record twice, which the consumer downstream answers by
    /// its key).
    pub fn from_config(config: &ClientConfig) -> Result<Self, KafkaError> {
        let mut config = config.clone();
        for (setting, value) in [
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("message.timeout.ms", "15000"),
        ] {
            if config.get(setting).is_none() {
                config.set(setting, value);
            }
        }
        Ok(Self {
            producer: config.create()?,
        })
    }
}

impl Sender for KafkaSender {
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a> {
        Box::pin(async move {
            let mut headers = OwnedHeaders::new();
            for (name, value) in message.stamped_headers() {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
            let record = FutureRecord::to(message.destination())
                .key(message.id())
                .payload(message.payload().as_ref())
                .headers(headers);
            match self
                .producer
                .send(record, Timeout::After(DELIVERY_TIMEOUT))
                .await
            {
                Ok(_) => Ok(()),
                Err((error, _)) => Err(classify(error)),
            }
        })
    }
}

/// A record the broker will never take as it is (too large, an invalid
/// topic) is refused; anything else may pass when tried again.
fn classify(error: KafkaError) -> SendError {
    let refused = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidRecord
        )
    );
    if refused {
        SendError::Refused(error.into())
    } else {
        SendError::Unavailable(error.into())
    }
}
