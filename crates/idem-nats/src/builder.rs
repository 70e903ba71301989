//! [`NatsConsumerBuilder`]: defaults, settings, and the start-up checks
//! against the stream.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer};
use async_nats::jetstream::{self, Context};
use idem::{Codec, Store};
use idem_consumer::{Consumer, RedeliveryWindow};

use crate::broker::JetStream;
use crate::consumer::NatsConsumer;
use crate::error::{boxed, js_error, NatsError};

/// The concurrency (messages in flight per worker) unless configured.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// The consumer's `ack_wait` when idem creates it, unless configured.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// Builds a [`NatsConsumer`].
pub struct NatsConsumerBuilder<S, C> {
    pub(crate) url: String,
    pub(crate) stream: String,
    pub(crate) durable: String,
    pub(crate) consumer: Consumer<S, C>,
    pub(crate) concurrency: usize,
    pub(crate) ack_wait: Duration,
    pub(crate) filter_subject: Option<String>,
    pub(crate) dead_subject: Option<String>,
    pub(crate) redelivery_window: Option<Duration>,
}

impl<S, C> std::fmt::Debug for NatsConsumerBuilder<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConsumerBuilder")
            .field("stream", &self.stream)
            .field("durable", &self.durable)
            .field("consumer", &self.consumer)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
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
