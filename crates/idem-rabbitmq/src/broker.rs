//! The broker as `idem-consumer` drives it: deliveries in, settlements
//! (ack, retry queue, dead-letter) out, over a connection that heals.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use idem_consumer::{Broker, DeadLetter, Deliveries, SettleError};
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Confirmation, Connection};

use crate::error::{transient, RabbitError};
use crate::message::{AmqpMessage, RETRIES_HEADER};
use crate::topology::{long_string, Topology};

/// The RabbitMQ side of the consume loop.
pub(crate) struct Rabbit {
    /// Where to connect again when the connection is lost.
    pub(crate) url: String,
    pub(crate) link: Mutex<Link>,
    /// Held while the link is repaired.
    pub(crate) repairing: tokio::sync::Mutex<()>,
    /// Whether a run is under way: one at a time.
    pub(crate) running: AtomicBool,
    pub(crate) topology: Topology,
    pub(crate) prefetch: u16,
    /// The channel consuming and its consumer tag, while consuming.
    pub(crate) consuming: Mutex<Option<(Channel, ShortString)>>,
}

impl Broker for Rabbit {
    type Message = AmqpMessage;
    type Error = RabbitError;

    fn concurrency(&self) -> usize {
        usize::from(self.prefetch)
    }

    async fn deliveries(&self) -> Result<Deliveries<AmqpMessage, RabbitError>, RabbitError> {
        let queue = self.topology.queue.clone();
        let consume_error = |source| RabbitError::Consume {
            queue: queue.clone(),
            source,
        };
        let channel = self
            .link()
            .await?
            .connection
            .create_channel()
            .await
            .map_err(consume_error)?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(consume_error)?;
        let deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(consume_error)?;
        *self
            .consuming
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((channel, deliveries.tag()));
        let last = self.topology.last_delivery();
        Ok(Box::pin(deliveries.map(move |next| {
            next.map(|delivery| AmqpMessage::new(delivery, last))
                .map_err(|source| RabbitError::Consume {
                    queue: queue.clone(),
                    source,
                })
        })))
    }

    async fn ack(&self, message: &AmqpMessage) -> Result<(), SettleError> {
        message.acker.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    /// A copy to the retry queue whose TTL is the smallest at least
    /// `after`, then the ack.
    async fn retry(&self, message: &AmqpMessage, after: Duration) -> Result<(), SettleError> {
        let retries = match message.header_value(RETRIES_HEADER) {
            Some(AMQPValue::LongLongInt(n)) => n.saturating_add(1),
            _ => 1,
        };
        self.copy(
            message,
            &self.topology.retry_for(after),
            &[(RETRIES_HEADER, AMQPValue::LongLongInt(retries))],
        )
        .await?;
        self.ack(message).await
    }

    /// `basic.nack` with requeue: the broker delivers it again at once.
    async fn give_back(&self, message: &AmqpMessage) {
        let requeue = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        if let Err(error) = message.acker.nack(requeue).await {
            tracing::warn!(%error, "could not requeue a delivery; the broker redelivers it when the channel closes");
        }
    }

    async fn dead_letter(
        &self,
        message: &AmqpMessage,
        letter: &DeadLetter<'_>,
    ) -> Result<(), SettleError> {
        let headers: Vec<_> = letter
            .headers()
            .into_iter()
            .map(|(name, value)| (name, long_string(&value)))
            .collect();
        self.copy(message, &self.topology.dead(), &headers).await
    }

    /// A channel the broker closed (its `consumer_timeout`, a policy
    /// change) is replaced on the same connection, and a lost connection
    /// (the broker restarted, the network cut) is opened again, with the
    /// topology declared again. Refusals that trying again cannot change
    /// (wrong credentials, a queue declared with other arguments) end the
    /// run.
    fn resubscribe(&self, error: &RabbitError) -> bool {
        match error {
            RabbitError::Consume { .. } => true,
            RabbitError::Connect { source, .. } | RabbitError::Declare { source, .. } => {
                transient(source)
            }
            _ => false,
        }
    }

    /// Cancels the consumer, so no more deliveries come, and closes its
    /// channel: deliveries the broker had sent but the loop never took are
    /// requeued.
    async fn stop(&self) {
        let consuming = self
            .consuming
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some((channel, tag)) = consuming else {
            return;
        };
        if channel.status().connected() {
            if let Err(error) = channel
                .basic_cancel(tag, BasicCancelOptions::default())
                .await
            {
                tracing::warn!(%error, "basic.cancel failed; closing the channel instead");
            }
            let _ = channel.close(200, "idem consumer stopped".into()).await;
        }
    }
}

/// How long connecting, opening the publishing channel and declaring the
/// topology may take before the attempt is given up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection and the channel copies are published on.
#[derive(Clone)]
pub(crate) struct Link {
    connection: Arc<Connection>,
    /// With publisher confirms.
    publish: Channel,
}

impl Link {
    /// Connects, opens the publishing channel and declares the topology,
    /// within [`OPEN_TIMEOUT`].
    pub(crate) async fn open(url: &str, topology: &Topology) -> Result<Self, RabbitError> {
        let connect_error = |source| RabbitError::Connect {
            url: idem::url::redact(url),
            source,
        };
        let open = async {
            let connection = crate::connect::connect(url).await.map_err(connect_error)?;
            let publish = publishing_channel(&connection)
                .await
                .map_err(connect_error)?;
            topology.declare(&publish).await?;
            Ok(Self {
                connection: Arc::new(connection),
                publish,
            })
        };
        tokio::time::timeout(OPEN_TIMEOUT, open)
            .await
            .unwrap_or_else(|_| {
                Err(connect_error(lapin::Error::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {OPEN_TIMEOUT:?}"),
                ))))
            })
    }
}

/// A channel with publisher confirms on `connection`.
async fn publishing_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    let publish = connection.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(publish)
}

impl Rabbit {
    /// The link, repaired first if the broker closed its publishing
    /// channel or the connection was lost. One repair at a time: callers
    /// that find one under way wait for it and use what it made.
    async fn link(&self) -> Result<Link, RabbitError> {
        let current = self.current();
        if current.connection.status().connected() && current.publish.status().connected() {
            return Ok(current);
        }
        let _repairing = self.repairing.lock().await;
        let current = self.current();
        let link = if !current.connection.status().connected() {
            tracing::warn!(
                url = %idem::url::redact(&self.url),
                "the connection to RabbitMQ was lost; connecting again"
            );
            Link::open(&self.url, &self.topology).await?
        } else if !current.publish.status().connected() {
            tracing::warn!("the broker closed the publishing channel; opening another");
            let publish = publishing_channel(&current.connection)
                .await
                .map_err(|source| RabbitError::Connect {
                    url: idem::url::redact(&self.url),
                    source,
                })?;
            Link {
                connection: current.connection,
                publish,
            }
        } else {
            return Ok(current);
        };
        *self.link.lock().unwrap_or_else(PoisonError::into_inner) = link.clone();
        Ok(link)
    }

    fn current(&self) -> Link {
        self.link
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Publishes a copy of `message` to `queue` with extra headers, and
    /// waits for the broker's confirm.
    async fn copy(
        &self,
        message: &AmqpMessage,
        queue: &str,
        extra: &[(&str, AMQPValue)],
    ) -> Result<(), SettleError> {
        let mut headers = message.properties.headers().clone().unwrap_or_default();
        for (name, value) in extra {
            headers.insert((*name).into(), value.clone());
        }
        let properties = message.properties.clone().with_headers(headers);
        let confirm = self
            .link()
            .await?
            .publish
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.data,
                properties,
            )
            .await
            .map_err(|e| format!("publishing to {queue:?}: {e}"))?
            .await
            .map_err(|e| format!("confirm from {queue:?}: {e}"))?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => {
                Err(format!("queue {queue:?} does not exist (message returned)").into())
            }
            other => Err(format!("broker did not confirm the copy to {queue:?}: {other:?}").into()),
        }
    }
}
