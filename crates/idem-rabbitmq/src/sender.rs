//! The outbox's last hop to RabbitMQ: [`RabbitSender`].

use std::sync::Arc;
use std::time::Duration;

use idem::outbox::{Message, SendError, SendFuture, Sender};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use crate::topology::long_string;

/// How long a connection, or a publish and its confirm, may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Sends a run's outbox messages ([`idem::outbox`]) to RabbitMQ, with
/// publisher confirms: the message's destination is the routing key (on
/// the default exchange, so a queue's name, unless
/// [`exchange`](Self::exchange) names another), its id is the AMQP
/// `message_id` and the `Idempotency-Key` header (what an idem consumer
/// downstream keys on: RabbitMQ itself does not deduplicate), and it is
/// persistent and mandatory. A send is confirmed when the broker acks it;
/// a nack, a lost connection or a timeout leaves it pending (sent again
/// under the same id), a message no queue takes (returned) is refused.
/// The connection is opened on first use and again after it is lost.
///
/// ```no_run
/// let sender = idem_rabbitmq::RabbitSender::new("amqp://guest:guest@127.0.0.1:5672/%2f");
/// let idem = idem::Idempotency::builder(idem::MemoryStore::new())
///     .outbox(sender)
///     .build()?;
/// # let _ = idem;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RabbitSender {
    url: String,
    exchange: String,
    channel: Arc<Mutex<Option<(Connection, Channel)>>>,
}

impl std::fmt::Debug for RabbitSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSender")
            .field("url", &idem::url::redact(&self.url))
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}

impl RabbitSender {
    /// Sends to the broker at `url` (an `amqp://` URL), on the default
    /// exchange.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            exchange: String::new(),
            channel: Arc::default(),
        }
    }

    /// Publishes on `exchange`, destinations being its routing keys.
    pub fn exchange(mut self, exchange: &str) -> Self {
        self.exchange = exchange.to_owned();
        self
    }

    /// The publishing channel, opened again if it or its connection was
    /// lost.
    async fn channel(&self) -> Result<Channel, SendError> {
        let mut held = self.channel.lock().await;
        if let Some((connection, channel)) = held.as_ref() {
            if connection.status().connected() && channel.status().connected() {
                return Ok(channel.clone());
            }
        }
        let open = async {
            let connection = crate::connect::connect(&self.url).await?;
            let channel = connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>((connection, channel))
        };
        let (connection, channel) = tokio::time::timeout(TIMEOUT, open)
            .await
            .map_err(|_| unavailable("no connection to RabbitMQ within 10 s"))?
            .map_err(|e| unavailable(format!("connecting to RabbitMQ: {e}")))?;
        *held = Some((connection, channel.clone()));
        Ok(channel)
    }
}

fn unavailable(why: impl Into<String>) -> SendError {
    SendError::Unavailable(why.into().into())
}

impl Sender for RabbitSender {
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a> {
        Box::pin(async move {
            let channel = self.channel().await?;
            let mut headers = FieldTable::default();
            for (name, value) in message.stamped_headers() {
                headers.insert(name.into(), long_string(value));
            }
            let properties = BasicProperties::default()
                .with_message_id(message.id().into())
                .with_delivery_mode(2)
                .with_headers(headers);
            let publish = async {
                channel
                    .basic_publish(
                        self.exchange.as_str().into(),
                        message.destination().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        message.payload(),
                        properties,
                    )
                    .await?
                    .await
            };
            let confirm = tokio::time::timeout(TIMEOUT, publish)
                .await
                .map_err(|_| unavailable("no confirm from RabbitMQ within 10 s"))?
                .map_err(|e| unavailable(format!("publishing to RabbitMQ: {e}")))?;
            match confirm {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(_)) => Err(SendError::Refused(
                    format!(
                        "no queue takes routing key {:?} on exchange {:?} (message returned)",
                        message.destination(),
                        self.exchange
                    )
                    .into(),
                )),
                other => Err(unavailable(format!(
                    "the broker did not confirm: {other:?}"
                ))),
            }
        })
    }
}
