//! [`RabbitConsumerBuilder`]: defaults, settings and start-up.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Codec, Store};
use idem_consumer::{Consumer, RedeliveryWindow};

use crate::broker::{Link, Rabbit};
use crate::consumer::RabbitConsumer;
use crate::error::RabbitError;
use crate::topology::{validate, QueueKind, Topology};

/// The retry delays used unless configured: 1 s, 5 s, 30 s, 2 min, 10 min.
pub const DEFAULT_RETRY_DELAYS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
];

/// The prefetch (unacknowledged deliveries in flight) unless configured.
pub const DEFAULT_PREFETCH: u16 = 16;

/// Builds a [`RabbitConsumer`].
pub struct RabbitConsumerBuilder<S, C> {
    pub(crate) url: String,
    pub(crate) queue: String,
    pub(crate) consumer: Consumer<S, C>,
    pub(crate) prefetch: u16,
    pub(crate) retry_delays: Vec<Duration>,
    pub(crate) message_ttl: Option<Duration>,
    pub(crate) redelivery_window: Option<Duration>,
    pub(crate) kind: QueueKind,
}

impl<S, C> std::fmt::Debug for RabbitConsumerBuilder<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitConsumerBuilder")
            .field("queue", &self.queue)
            .field("consumer", &self.consumer)
            .field("prefetch", &self.prefetch)
            .field("retry_delays", &self.retry_delays)
            .finish_non_exhaustive()
    }
}

impl<S: Store, C: Codec> RabbitConsumerBuilder<S, C> {
    /// How many deliveries may be unacknowledged at once (default 16);
    /// they are processed concurrently.
    #[must_use]
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// The retry delays, one retry queue each (default
    /// [`DEFAULT_RETRY_DELAYS`]). A retry goes to the smallest delay at
    /// least as long as asked, or the longest.
    #[must_use]
    pub fn retry_delays(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.retry_delays = delays.into_iter().collect();
        self
    }

    /// Gives `<queue>` this message TTL: messages waiting longer are moved
    /// to `<queue>.dead` (never dropped), and the redelivery window is
    /// known.
    #[must_use]
    pub fn message_ttl(mut self, ttl: Duration) -> Self {
        self.message_ttl = Some(ttl);
        self
    }

    /// States the longest a message can wait in `<queue>` (the longest
    /// backlog you run with) when it has no message TTL.
    #[must_use]
    pub fn redelivery_window(mut self, window: Duration) -> Self {
        self.redelivery_window = Some(window);
        self
    }

    /// Declares the queue, its retry queues and its dead-letter queue as
    /// quorum queues (`x-queue-type: quorum`, replicated; RabbitMQ 4's
    /// default type), the queues that dead-letter with at-least-once
    /// dead-lettering so that no retry is dropped on its way back. An
    /// existing quorum queue needs this: declared as classic, the broker
    /// refuses it as declared otherwise.
    #[must_use]
    pub fn quorum(mut self) -> Self {
        self.kind.quorum = true;
        self
    }

    /// The quorum queue's `x-delivery-limit`: how often a message may be
    /// returned (a worker that died, a connection lost before the ack)
    /// before the broker moves it aside. Declared on the queue, and read
    /// by the consumer: the broker's last delivery of a message is
    /// dead-lettered to `<queue>.dead` with the reason instead of being
    /// run (see [`idem_consumer::Message::last_delivery`]). Give the
    /// limit an existing queue has; RabbitMQ 4 gives quorum queues 20
    /// unless told. Needs [`quorum`](Self::quorum).
    #[must_use]
    pub fn delivery_limit(mut self, limit: u32) -> Self {
        self.kind.delivery_limit = Some(limit);
        self
    }

    /// Connects, checks the configuration and declares the topology.
    pub async fn connect(self) -> Result<RabbitConsumer<S, C>, RabbitError> {
        let mut delays = self.retry_delays.clone();
        delays.sort();
        delays.dedup();
        validate(&self.queue, self.prefetch, &delays, self.kind)?;
        let longest = delays.last().copied().unwrap_or_default();
        let window = match (self.message_ttl, self.redelivery_window) {
            (Some(ttl), _) => RedeliveryWindow::new(
                format!(
                    "queue {:?}'s message TTL ({ttl:?}) plus its longest retry delay \
                     ({longest:?})",
                    self.queue
                ),
                ttl + longest,
            ),
            (None, Some(window)) => RedeliveryWindow::new(
                format!(
                    "queue {:?}'s stated redelivery window ({window:?}) plus its longest retry \
                     delay ({longest:?})",
                    self.queue
                ),
                window + longest,
            ),
            (None, None) => RedeliveryWindow::unbounded(format!(
                "queue {:?} (no message_ttl and no stated redelivery_window)",
                self.queue
            )),
        };
        self.consumer.check_windows(&[window])?;
        let topology = Topology {
            queue: self.queue,
            retries: delays,
            message_ttl: self.message_ttl,
            kind: self.kind,
        };
        let link = Link::open(&self.url, &topology).await?;
        Ok(RabbitConsumer {
            broker: Arc::new(Rabbit {
                url: self.url,
                link: Mutex::new(link),
                repairing: tokio::sync::Mutex::new(()),
                running: AtomicBool::new(false),
                topology,
                prefetch: self.prefetch,
                consuming: Mutex::new(None),
            }),
            consumer: self.consumer,
        })
    }
}

impl<S: Store> RabbitConsumer<S, idem::Json> {
    /// A consumer of `queue` at `url` (`amqp://user:pass@host:port/vhost`).
    pub fn builder<C: Codec>(
        url: &str,
        queue: &str,
        consumer: Consumer<S, C>,
    ) -> RabbitConsumerBuilder<S, C> {
        RabbitConsumerBuilder {
            url: url.to_owned(),
            queue: queue.to_owned(),
            consumer,
            prefetch: DEFAULT_PREFETCH,
            retry_delays: DEFAULT_RETRY_DELAYS.to_vec(),
            message_ttl: None,
            redelivery_window: None,
            kind: QueueKind::default(),
        }
    }
}
