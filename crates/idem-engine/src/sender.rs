//! Outbox URLs: the broker a run's messages go to ([`EngineOptions::outbox`](crate::EngineOptions::outbox)),
//! and opening its sender.
//!
//! | URL | sender | a message's destination |
//! |---|---|---|
//! | `amqp://…`, `amqps://…` (feature `rabbitmq`) | `idem_rabbitmq::RabbitSender`, publisher confirms | a routing key on the default exchange: a queue's name |
//! | `nats://…`, `tls://…` (feature `nats`) | `idem_nats::JetStreamSender`, `Nats-Msg-Id` | a subject a stream captures |
//! | `kafka://HOST:PORT[,HOST:PORT…]` (feature `kafka`) | `idem_kafka::KafkaSender`, idempotent producer | a topic |
//! | `sqs://[?endpoint=URL][&region=R]` (feature `sqs`) | `idem_sqs::SqsSender` (credentials from the environment) | a queue URL |

use std::sync::Arc;

use idem::outbox::Sender;

use crate::error::EngineError;

/// A broker named by an outbox URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderUrl {
    /// `amqp://…`, `amqps://…`: RabbitMQ (the URL as lapin reads it).
    RabbitMq(String),
    /// `nats://…`, `tls://…`: NATS JetStream.
    Nats(String),
    /// `kafka://HOST:PORT[,…]`: the bootstrap servers.
    Kafka(String),
    /// `sqs://[?endpoint=URL][&region=R]`: SQS (what follows the `?`).
    Sqs(String),
}

impl std::str::FromStr for SenderUrl {
    type Err = EngineError;

    fn from_str(url: &str) -> Result<Self, EngineError> {
        let refuse = |why: String| EngineError::Config(format!("outbox URL {url:?}: {why}"));
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(refuse(
                "use amqp://, nats://, kafka://HOST:PORT or sqs://".to_owned(),
            ));
        };
        let (parsed, feature) = match scheme {
            "amqp" | "amqps" => (SenderUrl::RabbitMq(url.to_owned()), "rabbitmq"),
            "nats" | "tls" => (SenderUrl::Nats(url.to_owned()), "nats"),
            "kafka" if rest.is_empty() || rest.contains(['/', '?']) => {
                return Err(refuse(
                    "name the bootstrap servers: kafka://HOST:PORT[,HOST:PORT]".to_owned(),
                ))
            }
            "kafka" => (SenderUrl::Kafka(rest.to_owned()), "kafka"),
            "sqs" => {
                let query = rest.strip_prefix('/').unwrap_or(rest);
                let Some(query) = query.strip_prefix('?').or((query.is_empty()).then_some(""))
                else {
                    return Err(refuse(
                        "an sqs:// URL names no queue (a message's destination is its queue \
                         URL): sqs://[?endpoint=URL][&region=R]"
                            .to_owned(),
                    ));
                };
                (SenderUrl::Sqs(query.to_owned()), "sqs")
            }
            other => {
                return Err(refuse(format!(
                    "{other}:// is not a broker idem sends to (use amqp://, nats://, \
                     kafka://HOST:PORT or sqs://)"
                )))
            }
        };
        if !built(feature) {
            return Err(refuse(format!(
                "the {feature} sender is not in this build (build with the `{feature}` feature)"
            )));
        }
        Ok(parsed)
    }
}

/// The senders and whether each is compiled in.
const BUILT: [(&str, bool); 4] = [
    ("rabbitmq", cfg!(feature = "rabbitmq")),
    ("nats", cfg!(feature = "nats")),
    ("kafka", cfg!(feature = "kafka")),
    ("sqs", cfg!(feature = "sqs")),
];

/// Whether the sender of `feature` is compiled in.
fn built(feature: &str) -> bool {
    BUILT.iter().any(|&(name, built)| name == feature && built)
}

impl SenderUrl {
    /// The sender, connected where the broker's client connects at once
    /// (NATS); the others connect on their first send.
    pub async fn open(&self) -> Result<Arc<dyn Sender>, EngineError> {
        match self {
            #[cfg(feature = "rabbitmq")]
            SenderUrl::RabbitMq(url) => Ok(Arc::new(idem_rabbitmq::RabbitSender::new(url))),
            #[cfg(feature = "nats")]
            SenderUrl::Nats(url) => {
                let client = async_nats::connect(url.as_str())
                    .await
                    .map_err(|e| unreachable_broker(url, &e))?;
                Ok(Arc::new(idem_nats::JetStreamSender::new(
                    async_nats::jetstream::new(client),
                )))
            }
            #[cfg(feature = "kafka")]
            SenderUrl::Kafka(bootstrap) => idem_kafka::KafkaSender::new(bootstrap)
                .map(|sender| Arc::new(sender) as Arc<dyn Sender>)
                .map_err(|e| EngineError::Config(format!("the Kafka sender: {e}"))),
            #[cfg(feature = "sqs")]
            SenderUrl::Sqs(query) => {
                let options = idem_aws::UrlOptions::parse(query).map_err(|why| {
                    EngineError::Config(format!("outbox URL sqs://?{query}: {why}"))
                })?;
                let client = idem_sqs::client_from_options(&options)
                    .map_err(|e| EngineError::Config(format!("the SQS sender: {e}")))?;
                Ok(Arc::new(idem_sqs::SqsSender::new(client)))
            }
            #[allow(unreachable_patterns)]
            other => Err(EngineError::Config(format!(
                "the sender of {other:?} is not in this build"
            ))),
        }
    }
}

#[cfg(feature = "nats")]
fn unreachable_broker(url: &str, error: &dyn std::fmt::Display) -> EngineError {
    EngineError::Config(format!(
        "the outbox broker {url:?} cannot be reached: {error}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> String {
        match url.parse::<SenderUrl>() {
            Err(EngineError::Config(why)) => why,
            other => panic!("{url} was not refused: {other:?}"),
        }
    }

    #[test]
    fn urls_name_their_broker_or_say_what_is_wrong() {
        assert!(refused("redis://127.0.0.1").contains("not a broker idem sends to"));
        assert!(refused("127.0.0.1:5672").contains("use amqp://"));
        assert!(refused("kafka://").contains("bootstrap servers"));
        assert!(refused("kafka://h:9092/topic").contains("bootstrap servers"));
        assert!(refused("sqs://queue-name").contains("names no queue"));
        for (url, feature) in [
            ("amqp://guest:guest@127.0.0.1:5672/%2f", "rabbitmq"),
            ("nats://127.0.0.1:4222", "nats"),
            ("kafka://a:9092,b:9092", "kafka"),
            (
                "sqs://?endpoint=http://127.0.0.1:5000&region=us-east-1",
                "sqs",
            ),
            ("sqs://", "sqs"),
        ] {
            match url.parse::<SenderUrl>() {
                Ok(parsed) => {
                    assert!(built(feature), "{url} parsed without its feature");
                    if let SenderUrl::Kafka(bootstrap) = parsed {
                        assert_eq!(bootstrap, "a:9092,b:9092");
                    }
                }
                Err(_) => assert!(
                    refused(url).contains(&format!("`{feature}` feature")),
                    "{url}"
                ),
            }
        }
    }
}
