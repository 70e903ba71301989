//! # idem-rabbitmq: exactly-once effects for RabbitMQ consumers
//!
//! Runs every delivery of a queue through [`idem_consumer::Consumer`] and
//! carries out its [`Disposition`](idem_consumer::Disposition) with manual acknowledgements:
//!
//! | disposition | what happens on the broker |
//! |---|---|
//! | ack | `basic.ack` |
//! | retry after *d* | a copy goes to the retry queue `<queue>.retry.<ms>ms` whose TTL is the smallest bucket ≥ *d*; when it expires RabbitMQ dead-letters it back to `<queue>`. The original is acked once the copy is confirmed |
//! | dead-letter | a copy goes to `<queue>.dead` with headers `Idem-Reason`, `Idem-Key` and `Idem-Consumer` (idem's one dead-letter vocabulary); the original is acked once the copy is confirmed |
//!
//! Copies keep the original's properties and headers, so the key is read
//! the same way on every delivery. Every copy is published with publisher
//! confirms and `mandatory`, and the original is acked only once its copy
//! is confirmed. A dead-letter copy that is not confirmed makes the
//! message a retry after the longest delay instead, and a retry copy that
//! is not confirmed requeues the original (`basic.nack` with requeue), so
//! nothing is lost — at worst a message is delivered once more, which the
//! key makes harmless.
//! A worker that dies leaves its unacknowledged deliveries to the broker,
//! which redelivers them; a duplicate whose first delivery is still
//! running elsewhere is retried later, never acked.
//!
//! Retry queues with a fixed TTL each, rather than a per-message
//! expiration on one queue, keep delays exact: RabbitMQ expires messages
//! only at the head of a queue, so a long per-message delay would hold up
//! every shorter one behind it.
//!
//! ## Topology
//!
//! [`RabbitConsumerBuilder::connect`] declares, all durable: `<queue>` (with
//! `x-dead-letter-routing-key = <queue>.dead`, so messages that expire in
//! it are dead-lettered rather than dropped, and `x-message-ttl` when
//! [`message_ttl`](RabbitConsumerBuilder::message_ttl) is set), one
//! `<queue>.retry.<ms>ms` per retry delay, and `<queue>.dead`. A queue that
//! already exists with other arguments is refused with the broker's reason.
//!
//! ## The broker's `consumer_timeout`
//!
//! RabbitMQ closes a channel on which a delivery stays unacknowledged
//! longer than its `consumer_timeout` (30 minutes unless configured) and
//! requeues everything the channel held. A handler that runs that long
//! does not stop the consumer: it opens a new channel on the same
//! connection and goes on. The requeued copy of the long-running message
//! meets its live claim and is retried later, never run twice; once the
//! handler finishes, the copy replays the stored outcome and is acked (the
//! original's ack on the closed channel fails, harmlessly). Each such close
//! costs a redelivery of the whole prefetch window, so set
//! `consumer_timeout` above your longest handler when you can.
//!
//! A lost connection is opened again the same way (the topology declared
//! again), and an ack that was queued on the connection that died is
//! given up after [`idem_consumer::SETTLE_TIMEOUT`]: its message comes
//! back and replays its stored outcome.
//!
//! ## The redelivery window
//!
//! A completed record must outlive every duplicate. Duplicates can wait in
//! `<queue>` as long as its message TTL, plus the longest retry delay, so
//! start-up refuses a retention shorter than that. A queue without a
//! message TTL can hold a message without limit: then state the longest
//! backlog you run with, [`redelivery_window`](RabbitConsumerBuilder::redelivery_window),
//! or start-up refuses it.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use idem::{Idempotency, Scope};
//! use idem_consumer::Consumer;
//! use idem_rabbitmq::RabbitConsumer;
//!
//! let store = idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let idem = Idempotency::builder(store).build()?;
//! let consumer = Consumer::builder(idem, Scope::new("orders")?).build();
//! let rabbit = RabbitConsumer::builder("amqp://guest:guest@127.0.0.1:5672/%2f", "orders", consumer)
//!     .prefetch(32)
//!     .redelivery_window(Duration::from_secs(6 * 3600))
//!     .connect()
//!     .await?;
//! rabbit
//!     .run(
//!         |job| async move {
//!             let order: serde_json::Value = job.json()?;
//!             // charge the order, passing job.ctx().fence() downstream
//!             Ok::<_, idem::Terminal>(order["id"].clone())
//!         },
//!         async { tokio::signal::ctrl_c().await.ok(); },
//!     )
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::error::Error as StdError;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use idem::{Codec, Store};
use idem_consumer::{
    Broker, Consumer, DeadLetter, Deliveries, Job, Message, RedeliveryWindow, SettleError, Stopped,
};
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Acker, BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde::de::DeserializeOwned;
use serde::Serialize;

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

/// Header counting how many times a message went through a retry queue.
pub const RETRIES_HEADER: &str = "x-idem-retries";

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

/// One delivery from RabbitMQ.
#[derive(Debug)]
pub struct AmqpMessage {
    data: Vec<u8>,
    properties: BasicProperties,
    exchange: String,
    routing_key: String,
    redelivered: bool,
    acker: Acker,
}

impl AmqpMessage {
    fn new(delivery: Delivery) -> Self {
        Self {
            data: delivery.data,
            properties: delivery.properties,
            exchange: delivery.exchange.to_string(),
            routing_key: delivery.routing_key.to_string(),
            redelivered: delivery.redelivered,
            acker: delivery.acker,
        }
    }

    /// The AMQP properties, headers included.
    pub fn properties(&self) -> &BasicProperties {
        &self.properties
    }

    /// The exchange it was published to (empty for the default exchange).
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// Its routing key.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// Whether the broker delivered it before (to this or another
    /// consumer) without an acknowledgement.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    fn header_value(&self, name: &str) -> Option<&AMQPValue> {
        self.properties.headers().as_ref()?.inner().get(name)
    }
}

impl Message for AmqpMessage {
    fn payload(&self) -> &[u8] {
        &self.data
    }

    fn header(&self, name: &str) -> Option<&str> {
        match self.header_value(name)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn message_id(&self) -> Option<&str> {
        self.properties
            .message_id()
            .as_ref()
            .map(ShortString::as_str)
    }

    fn delivery_count(&self) -> Option<u32> {
        match self.header_value("x-delivery-count")? {
            AMQPValue::LongLongInt(n) => u32::try_from(*n).ok().map(|n| n + 1),
            AMQPValue::LongInt(n) => u32::try_from(*n).ok().map(|n| n + 1),
            _ => None,
        }
    }
}

/// Builds a [`RabbitConsumer`].
pub struct RabbitConsumerBuilder<S, C> {
    url: String,
    queue: String,
    consumer: Consumer<S, C>,
    prefetch: u16,
    retry_delays: Vec<Duration>,
    message_ttl: Option<Duration>,
    redelivery_window: Option<Duration>,
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

    /// Connects, checks the configuration and declares the topology.
    pub async fn connect(self) -> Result<RabbitConsumer<S, C>, RabbitError> {
        let mut delays = self.retry_delays.clone();
        delays.sort();
        delays.dedup();
        validate(&self.queue, self.prefetch, &delays)?;
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

fn validate(queue: &str, prefetch: u16, delays: &[Duration]) -> Result<(), RabbitError> {
    if queue.is_empty() || queue.len() > 200 {
        return Err(RabbitError::Config(format!(
            "queue name must be 1..=200 bytes (the retry and dead-letter queues add a suffix), \
             got {} bytes",
            queue.len()
        )));
    }
    if prefetch == 0 {
        return Err(RabbitError::Config(
            "prefetch must be at least 1 (0 means unlimited in AMQP)".to_owned(),
        ));
    }
    if delays.is_empty() {
        return Err(RabbitError::Config(
            "at least one retry delay is needed".to_owned(),
        ));
    }
    if let Some(bad) = delays
        .iter()
        .find(|d| d.as_millis() == 0 || d.as_millis() > u128::from(u32::MAX))
    {
        return Err(RabbitError::Config(format!(
            "retry delay {bad:?} must be 1 ms to {} ms",
            u32::MAX
        )));
    }
    Ok(())
}

struct Topology {
    queue: String,
    retries: Vec<Duration>,
    message_ttl: Option<Duration>,
}

impl Topology {
    fn dead(&self) -> String {
        format!("{}.dead", self.queue)
    }

    fn retry_queue(&self, delay: Duration) -> String {
        format!("{}.retry.{}ms", self.queue, delay.as_millis())
    }

    /// The retry queue for a delay: the smallest at least as long, or the
    /// longest.
    fn retry_for(&self, after: Duration) -> String {
        let delay = self
            .retries
            .iter()
            .copied()
            .find(|d| *d >= after)
            .or_else(|| self.retries.last().copied())
            .unwrap_or(after);
        self.retry_queue(delay)
    }

    async fn declare(&self, channel: &Channel) -> Result<(), RabbitError> {
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        let declare = |name: String, args: FieldTable| async move {
            channel
                .queue_declare(name.as_str().into(), durable, args)
                .await
                .map_err(|source| RabbitError::Declare {
                    queue: name.clone(),
                    source,
                })
        };
        declare(self.dead(), FieldTable::default()).await?;
        let mut main = dead_letter_to(&self.dead());
        if let Some(ttl) = self.message_ttl {
            main.insert("x-message-ttl".into(), millis(ttl));
        }
        declare(self.queue.clone(), main).await?;
        for delay in &self.retries {
            let mut args = dead_letter_to(&self.queue);
            args.insert("x-message-ttl".into(), millis(*delay));
            declare(self.retry_queue(*delay), args).await?;
        }
        Ok(())
    }
}

fn dead_letter_to(queue: &str) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-dead-letter-exchange".into(), long_string(""));
    args.insert("x-dead-letter-routing-key".into(), long_string(queue));
    args
}

fn millis(d: Duration) -> AMQPValue {
    AMQPValue::LongLongInt(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes().to_vec()))
}

/// A RabbitMQ queue consumer that runs every delivery through idem.
pub struct RabbitConsumer<S, C> {
    broker: Arc<Rabbit>,
    consumer: Consumer<S, C>,
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
        }
    }
}

impl<S, C> RabbitConsumer<S, C>
where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// The consumer layer, for its [`stats`](Consumer::stats).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.consumer
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.broker.topology.queue
    }

    /// The dead-letter queue, `<queue>.dead`.
    pub fn dead_letter_queue(&self) -> String {
        self.broker.topology.dead()
    }

    /// Every queue of the topology: the queue, its retry queues and its
    /// dead-letter queue.
    pub fn queues(&self) -> Vec<String> {
        let t = &self.broker.topology;
        std::iter::once(t.queue.clone())
            .chain(t.retries.iter().map(|d| t.retry_queue(*d)))
            .chain(std::iter::once(t.dead()))
            .collect()
    }

    /// Consumes until `shutdown` resolves, then stops taking deliveries,
    /// lets the ones in flight finish and settle, and returns. Deliveries
    /// taken but not settled stay with the broker, which redelivers them:
    /// nothing is lost on shutdown or on a crash.
    ///
    /// A channel the broker closes (its `consumer_timeout`) is replaced,
    /// and a lost connection (the broker restarted, the network cut) is
    /// opened again, trying every 100 ms to 5 s until it works; consuming
    /// then goes on. Deliveries the lost channel held are redelivered by
    /// the broker and meet their keys. Returns an error when the broker
    /// ends the consumer (queue deleted); call it again (with a fresh
    /// [`connect`]) to go on.
    ///
    /// [`connect`]: RabbitConsumerBuilder::connect
    pub async fn run<H, Fut, T, E>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RabbitError>
    where
        H: Fn(Job<AmqpMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        if self.broker.running.swap(true, Ordering::SeqCst) {
            return Err(RabbitError::Config(
                "this consumer is already running; connect another to consume in parallel"
                    .to_owned(),
            ));
        }
        let ran = self.consumer.run(&self.broker, handler, shutdown).await;
        self.broker.running.store(false, Ordering::SeqCst);
        match ran? {
            Stopped::Shutdown => Ok(()),
            Stopped::Ended => Err(RabbitError::Ended {
                queue: self.broker.topology.queue.clone(),
            }),
        }
    }
}

/// The RabbitMQ side of the consume loop.
struct Rabbit {
    /// Where to connect again when the connection is lost.
    url: String,
    link: Mutex<Link>,
    /// Held while the link is repaired.
    repairing: tokio::sync::Mutex<()>,
    /// Whether a run is under way: one at a time.
    running: AtomicBool,
    topology: Topology,
    prefetch: u16,
    /// The channel consuming and its consumer tag, while consuming.
    consuming: Mutex<Option<(Channel, ShortString)>>,
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
        Ok(Box::pin(deliveries.map(move |next| {
            next.map(AmqpMessage::new)
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

/// Whether trying again may get past `error`: not for the broker's
/// refusals (access refused 403, not found 404, precondition failed 406,
/// not allowed 530) or a failed login.
fn transient(error: &lapin::Error) -> bool {
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

/// How long connecting, opening the publishing channel and declaring the
/// topology may take before the attempt is given up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection and the channel copies are published on.
#[derive(Clone)]
struct Link {
    connection: Arc<Connection>,
    /// With publisher confirms.
    publish: Channel,
}

impl Link {
    /// Connects, opens the publishing channel and declares the topology,
    /// within [`OPEN_TIMEOUT`].
    async fn open(url: &str, topology: &Topology) -> Result<Self, RabbitError> {
        let connect_error = |source| RabbitError::Connect {
            url: idem::url::redact(url),
            source,
        };
        let open = async {
            let connection = Connection::connect(url, ConnectionProperties::default())
                .await
                .map_err(connect_error)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_goes_to_the_smallest_queue_at_least_as_long() {
        let t = Topology {
            queue: "q".to_owned(),
            retries: DEFAULT_RETRY_DELAYS.to_vec(),
            message_ttl: None,
        };
        assert_eq!(t.retry_for(Duration::from_millis(1)), "q.retry.1000ms");
        assert_eq!(t.retry_for(Duration::from_secs(1)), "q.retry.1000ms");
        assert_eq!(t.retry_for(Duration::from_millis(1001)), "q.retry.5000ms");
        assert_eq!(t.retry_for(Duration::from_secs(3600)), "q.retry.600000ms");
    }

    #[test]
    fn bad_configuration_is_refused_with_the_rule() {
        let ok = [Duration::from_secs(1)];
        assert!(validate("q", 16, &ok).is_ok());
        for (queue, prefetch, delays, needle) in [
            ("", 16, &ok[..], "1..=200 bytes"),
            ("q", 0, &ok[..], "prefetch"),
            ("q", 16, &[][..], "at least one retry delay"),
            ("q", 16, &[Duration::ZERO][..], "must be 1 ms"),
        ] {
            let err = validate(queue, prefetch, delays).expect_err("refused");
            assert!(err.to_string().contains(needle), "{err}");
        }
    }
}
