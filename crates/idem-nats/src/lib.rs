//! # idem-nats: exactly-once effects for NATS JetStream consumers
//!
//! Runs every message of a durable pull consumer through
//! [`idem_consumer::Consumer`] and carries out its [`Disposition`](idem_consumer::Disposition):
//!
//! | disposition | what happens on the server |
//! |---|---|
//! | ack | `+ACK` |
//! | retry after *d* | `-NAK {"delay": d}`: JetStream redelivers after *d* |
//! | dead-letter | a copy is published to the dead-letter subject (default `idem.dead.<stream>`) with headers `Idem-Reason`, `Idem-Key`, `Idem-Consumer`, `Idem-Subject` and `Idem-Stream-Sequence`, and once JetStream has stored it, `+TERM` stops redelivery |
//!
//! While a handler runs, every lease extension the store confirms also
//! sends `+WPI` (work in progress), which restarts the consumer's
//! `ack_wait`: a long handler is not redelivered to another worker while
//! its claim is alive, and as soon as the claim is lost (the worker hangs
//! or dies), the in-progress acks stop and JetStream redelivers.
//!
//! A dead-letter copy that JetStream does not store (no stream captures
//! the subject, or the server is away) is not a dead-letter: the message
//! is NAK'd with the longest retry delay instead, so it is never lost.
//! [`NatsConsumerBuilder::connect`] creates a stream `<stream>_DEAD` for the
//! dead-letter subject unless one already captures it.
//!
//! ## Start-up checks
//!
//! - the stream must exist;
//! - record retention must exceed the stream's `max_age` (how long a
//!   message, and so its redelivery, can stay) and `duplicate_window`; a
//!   stream keeping messages forever (`max_age` 0) needs a stated
//!   [`redelivery_window`](NatsConsumerBuilder::redelivery_window);
//! - the consumer (created if missing, durable, explicit acks) must have an
//!   `ack_wait` longer than the heartbeat, and an unlimited `max_deliver`:
//!   JetStream silently stops delivering a message after `max_deliver`
//!   tries, which would lose a message that met a claim in progress.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, Scope};
//! use idem_consumer::{Consumer, KeyExtractor};
//! use idem_nats::NatsConsumer;
//!
//! let store = idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let idem = Idempotency::builder(store).build()?;
//! let consumer = Consumer::builder(idem, Scope::new("orders")?)
//!     .keys(KeyExtractor::header("Nats-Msg-Id"))
//!     .build();
//! let nats = NatsConsumer::builder("nats://127.0.0.1:4222", "ORDERS", "billing", consumer)
//!     .connect()
//!     .await?;
//! nats.run(
//!     |job| async move {
//!         let order: serde_json::Value = job.json()?;
//!         Ok::<_, idem::Terminal>(order["id"].clone())
//!     },
//!     async { tokio::signal::ctrl_c().await.ok(); },
//! )
//! .await?;
//! # Ok(())
//! # }
//! ```

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::message::{AckKind, Acker};
use async_nats::jetstream::{self, Context};
use async_nats::HeaderMap;
use futures_util::future::ready;
use futures_util::StreamExt;
use idem::{Codec, Store};
use idem_consumer::{
    Broker, Consumer, DeadLetter, Deliveries, Job, Message, RedeliveryWindow, SettleError, Stopped,
};
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The concurrency (messages in flight per worker) unless configured.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// The consumer's `ack_wait` when idem creates it, unless configured.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// Header with the subject a dead-lettered message was published to.
pub const SUBJECT_HEADER: &str = "Idem-Subject";
/// Header with the stream sequence of a dead-lettered message.
pub const SEQUENCE_HEADER: &str = "Idem-Stream-Sequence";

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

fn js_error(what: impl Into<String>) -> impl FnOnce(async_nats::Error) -> NatsError {
    let what = what.into();
    move |source| NatsError::JetStream { what, source }
}

fn boxed<E: StdError + Send + Sync + 'static>(e: E) -> async_nats::Error {
    Box::new(e)
}

/// One JetStream message.
pub struct NatsMessage {
    message: async_nats::Message,
    acker: Acker,
    delivered: u32,
    stream_sequence: u64,
}

impl std::fmt::Debug for NatsMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsMessage")
            .field("subject", &self.message.subject)
            .field("stream_sequence", &self.stream_sequence)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl NatsMessage {
    /// The subject it was published to.
    pub fn subject(&self) -> &str {
        self.message.subject.as_str()
    }

    /// Its headers, if any.
    pub fn headers(&self) -> Option<&HeaderMap> {
        self.message.headers.as_ref()
    }

    /// Its sequence number in the stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }
}

impl Message for NatsMessage {
    fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.message.headers.as_ref()?.get(name).map(|v| v.as_str())
    }

    fn message_id(&self) -> Option<&str> {
        self.header("Nats-Msg-Id")
    }

    fn delivery_count(&self) -> Option<u32> {
        Some(self.delivered)
    }

    async fn keep_alive(&self) {
        if let Err(error) = self.acker.ack_with(AckKind::Progress).await {
            tracing::warn!(%error, "in-progress ack failed; JetStream may redeliver after ack_wait");
        }
    }
}

/// Builds a [`NatsConsumer`].
pub struct NatsConsumerBuilder<S, C> {
    url: String,
    stream: String,
    durable: String,
    consumer: Consumer<S, C>,
    concurrency: usize,
    ack_wait: Duration,
    filter_subject: Option<String>,
    dead_subject: Option<String>,
    redelivery_window: Option<Duration>,
}

impl<S: Store, C: Codec> NatsConsumerBuilder<S, C> {
    /// Messages processed at once (default 16); also the consumer's
    /// `max_ack_pending` when idem creates it.
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// The `ack_wait` of the consumer when idem creates it (default 30 s).
    /// An existing consumer keeps its own, which is checked.
    #[must_use]
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// Only subjects matching this, when idem creates the consumer.
    #[must_use]
    pub fn filter_subject(mut self, subject: impl Into<String>) -> Self {
        self.filter_subject = Some(subject.into());
        self
    }

    /// Where dead-letter copies go (default `idem.dead.<stream>`).
    #[must_use]
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_subject = Some(subject.into());
        self
    }

    /// States the longest a message can stay unconsumed, for streams that
    /// keep messages without limit (`max_age` 0).
    #[must_use]
    pub fn redelivery_window(mut self, window: Duration) -> Self {
        self.redelivery_window = Some(window);
        self
    }

    /// Connects, checks the stream and the consumer, and creates what is
    /// missing (the durable consumer, the dead-letter stream).
    pub async fn connect(self) -> Result<NatsConsumer<S, C>, NatsError> {
        if self.concurrency == 0 {
            return Err(NatsError::Config(
                "concurrency must be at least 1".to_owned(),
            ));
        }
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(self.url.as_str())
            .await
            .map_err(|source| NatsError::Connect {
                url: idem::url::redact(&self.url),
                source,
            })?;
        let js = jetstream::new(client);
        let mut stream = js
            .get_stream(&self.stream)
            .await
            .map_err(boxed)
            .map_err(js_error(format!(
                "stream {:?} not found (idem does not create the stream it consumes)",
                self.stream
            )))?;
        let info = stream
            .info()
            .await
            .map_err(boxed)
            .map_err(js_error(format!("reading stream {:?}", self.stream)))?
            .clone();
        let name = &self.stream;
        let mut windows = vec![RedeliveryWindow::new(
            format!("stream {name:?} duplicate_window"),
            info.config.duplicate_window,
        )];
        windows.push(
            match (info.config.max_age.is_zero(), self.redelivery_window) {
                (false, _) => {
                    RedeliveryWindow::new(format!("stream {name:?} max_age"), info.config.max_age)
                }
                (true, Some(window)) => RedeliveryWindow::new(
                    format!("stream {name:?}'s stated redelivery window"),
                    window,
                ),
                (true, None) => RedeliveryWindow::unbounded(format!(
                    "stream {name:?} (max_age 0, and no stated redelivery_window)"
                )),
            },
        );
        self.consumer.check_windows(&windows)?;

        let mut pull: PullConsumer = stream
            .get_or_create_consumer(
                &self.durable,
                PullConfig {
                    durable_name: Some(self.durable.clone()),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: self.ack_wait,
                    max_deliver: -1,
                    max_ack_pending: i64::try_from(self.concurrency).unwrap_or(i64::MAX),
                    filter_subject: self.filter_subject.clone().unwrap_or_default(),
                    ..PullConfig::default()
                },
            )
            .await
            .map_err(boxed)
            .map_err(js_error(format!(
                "creating durable consumer {:?} on stream {name:?}",
                self.durable
            )))?;
        let consumer_info = pull
            .info()
            .await
            .map_err(boxed)
            .map_err(js_error(format!("reading consumer {:?}", self.durable)))?
            .clone();
        let config = &consumer_info.config;
        if config.ack_policy != AckPolicy::Explicit {
            return Err(NatsError::Config(format!(
                "consumer {:?} has ack_policy {:?}; idem needs explicit acks, one per message",
                self.durable, config.ack_policy
            )));
        }
        if config.max_deliver > 0 {
            return Err(NatsError::Config(format!(
                "consumer {:?} has max_deliver {}: JetStream stops delivering a message after \
                 that many tries without telling anyone, which loses a message that kept meeting \
                 a claim in progress. Use max_deliver -1; idem dead-letters poison messages itself",
                self.durable, config.max_deliver
            )));
        }
        idem_consumer::check_keep_alive(
            self.consumer.idempotency(),
            &format!("consumer {:?} ack_wait", self.durable),
            config.ack_wait,
        )?;

        let dead_subject = self
            .dead_subject
            .unwrap_or_else(|| format!("idem.dead.{}", self.stream));
        ensure_dead_stream(&js, &self.stream, &dead_subject).await?;
        Ok(NatsConsumer {
            broker: Arc::new(JetStream {
                js,
                pull,
                durable: self.durable,
                dead_subject,
                concurrency: self.concurrency,
            }),
            consumer: self.consumer,
        })
    }
}

/// Makes sure a stream stores the dead-letter subject: the one that
/// already captures it, or a new `<stream>_DEAD`.
async fn ensure_dead_stream(js: &Context, stream: &str, subject: &str) -> Result<(), NatsError> {
    if js.stream_by_subject(subject).await.is_ok() {
        return Ok(());
    }
    js.get_or_create_stream(jetstream::stream::Config {
        name: format!("{stream}_DEAD"),
        subjects: vec![subject.to_owned()],
        ..Default::default()
    })
    .await
    .map_err(boxed)
    .map_err(js_error(format!(
        "creating stream {stream}_DEAD for dead-letter subject {subject:?}"
    )))?;
    Ok(())
}

/// A JetStream pull consumer that runs every message through idem.
pub struct NatsConsumer<S, C> {
    broker: Arc<JetStream>,
    consumer: Consumer<S, C>,
}

impl<S: Store> NatsConsumer<S, idem::Json> {
    /// The durable pull consumer `durable` of `stream` at `url`.
    pub fn builder<C: Codec>(
        url: &str,
        stream: &str,
        durable: &str,
        consumer: Consumer<S, C>,
    ) -> NatsConsumerBuilder<S, C> {
        NatsConsumerBuilder {
            url: url.to_owned(),
            stream: stream.to_owned(),
            durable: durable.to_owned(),
            consumer,
            concurrency: DEFAULT_CONCURRENCY,
            ack_wait: DEFAULT_ACK_WAIT,
            filter_subject: None,
            dead_subject: None,
            redelivery_window: None,
        }
    }
}

impl<S, C> NatsConsumer<S, C>
where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// The consumer layer, for its [`stats`](Consumer::stats).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.consumer
    }

    /// The subject dead-letter copies are published to.
    pub fn dead_letter_subject(&self) -> &str {
        &self.broker.dead_subject
    }

    /// Consumes until `shutdown` resolves, then takes no more messages,
    /// lets those in flight finish and settle, and returns. Messages
    /// fetched but not yet handed to a handler are left unacknowledged and
    /// redelivered after `ack_wait`: nothing is lost.
    pub async fn run<H, Fut, T, E>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), NatsError>
    where
        H: Fn(Job<NatsMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        match self.consumer.run(&self.broker, handler, shutdown).await? {
            Stopped::Shutdown => Ok(()),
            Stopped::Ended => Err(self.broker.consume_error("the message stream ended")),
        }
    }
}

/// The JetStream side of the consume loop.
struct JetStream {
    js: Context,
    pull: PullConsumer,
    durable: String,
    dead_subject: String,
    concurrency: usize,
}

impl JetStream {
    fn consume_error(&self, reason: impl Into<String>) -> NatsError {
        NatsError::Consume {
            consumer: self.durable.clone(),
            reason: reason.into(),
        }
    }
}

impl Broker for JetStream {
    type Message = NatsMessage;
    type Error = NatsError;

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    async fn deliveries(&self) -> Result<Deliveries<NatsMessage, NatsError>, NatsError> {
        let messages = self
            .pull
            .stream()
            .max_messages_per_batch(self.concurrency)
            .messages()
            .await
            .map_err(|e| self.consume_error(e.to_string()))?;
        // Pull errors (missed heartbeats and the like) are recovered by
        // the client itself, and a message that is not a JetStream one
        // cannot be acked: both are logged and skipped.
        Ok(Box::pin(messages.filter_map(|next| {
            ready(
                match next.map_err(async_nats::Error::from).and_then(split) {
                    Ok(message) => Some(Ok(message)),
                    Err(error) => {
                        tracing::warn!(%error, "JetStream pull error; skipped");
                        None
                    }
                },
            )
        })))
    }

    async fn ack(&self, message: &NatsMessage) -> Result<(), SettleError> {
        message.acker.ack_with(AckKind::Ack).await
    }

    async fn retry(&self, message: &NatsMessage, after: Duration) -> Result<(), SettleError> {
        message.acker.ack_with(AckKind::Nak(Some(after))).await
    }

    async fn dead_letter(
        &self,
        message: &NatsMessage,
        letter: &DeadLetter<'_>,
    ) -> Result<(), SettleError> {
        let mut headers = message.message.headers.clone().unwrap_or_default();
        for (name, value) in letter.headers() {
            headers.insert(name, value.as_str());
        }
        headers.insert(SUBJECT_HEADER, message.subject());
        headers.insert(
            SEQUENCE_HEADER,
            message.stream_sequence.to_string().as_str(),
        );
        self.js
            .publish_with_headers(
                self.dead_subject.clone(),
                headers,
                message.message.payload.clone(),
            )
            .await?
            .await?;
        Ok(())
    }

    /// `+TERM`: JetStream stops redelivering the original.
    async fn end_dead_lettered(&self, message: &NatsMessage) -> Result<(), SettleError> {
        message.acker.ack_with(AckKind::Term).await
    }
}

fn split(message: jetstream::Message) -> Result<NatsMessage, async_nats::Error> {
    let (delivered, stream_sequence) = {
        let info = message.info()?;
        (
            u32::try_from(info.delivered).unwrap_or(u32::MAX),
            info.stream_sequence,
        )
    };
    let (message, acker) = message.split();
    Ok(NatsMessage {
        message,
        acker,
        delivered,
        stream_sequence,
    })
}
