//! # idem-kafka: exactly-once effects for Kafka consumers
//!
//! Consumes one or more topics as a member of a consumer group, runs every
//! record through [`idem_consumer::Consumer`] and carries out its
//! [`Disposition`] the way Kafka allows:
//!
//! | disposition | what happens |
//! |---|---|
//! | ack | the partition's next offset is stored for commit |
//! | retry after *d* | the partition waits *d* and runs the record again, in place: no later record of that partition passes it |
//! | dead-letter | the record is produced to the dead-letter topic (default `<topic>.dead`, created if missing) with its key, payload and headers plus `Idem-Reason`, `Idem-Key`, `Idem-Consumer`, `Idem-Source-Topic`, `Idem-Source-Partition` and `Idem-Source-Offset`; once the broker has acknowledged the copy, the offset moves past it |
//!
//! ## Offsets and order
//!
//! Each assigned partition has its own worker (a *lane*) that takes the
//! partition's records in offset order, one at a time, so per-partition
//! order is kept; partitions run concurrently. An offset is stored only
//! after its record was acked or dead-lettered, and auto-commit commits
//! only stored offsets (`enable.auto.offset.store=false`): **the committed
//! offset never passes a record that was not processed**. A crash
//! redelivers at most the records after the last commit, and the
//! idempotency records turn those into replays.
//!
//! With [`PartitionOrder::Keys`], records of one partition with different
//! record keys run concurrently (up to a bound), and only records with the
//! same key keep their order: a record waiting for a retry then holds
//! back its own key, not the partition. The committed offset is still the
//! lowest record not yet settled.
//!
//! In offset order, [`KafkaConsumerBuilder::claim_ahead`] claims a
//! partition's waiting records in one round trip (the store's
//! `claim_many`); each still runs, completes and commits one at a time.
//!
//! A lane that has many records waiting pauses its partition, so a
//! partition stuck on retries holds back only itself, and the consumer
//! keeps polling (it never exceeds `max.poll.interval.ms` however long a
//! handler runs).
//!
//! ## Rebalances
//!
//! When the group takes partitions away, their lanes drop the records they
//! still hold and store no more offsets; librdkafka commits what was
//! stored. A handler already running finishes and stores its outcome under
//! its claim; the partition's new owner meets that claim (in progress:
//! retried after the lease) and then its stored outcome (a replay). A
//! claim whose worker died is taken over once its lease runs out. So a
//! rebalance can delay a record, never run it twice or skip it.
//!
//! ## Dead-letters
//!
//! A dead-letter copy is produced (and acknowledged by the broker) before
//! the record's offset is stored. A worker that dies between the two
//! leaves the record to be delivered again, and the stored failure is
//! dead-lettered again: copies are at least once, never lost. The
//! `Idem-Source-*` headers name the source record, so a reader of the
//! dead-letter topic can drop repeats.
//!
//! ## Keys
//!
//! [`Message::header`](idem_consumer::Message::header) reads Kafka headers
//! (the last one of a name wins). The consumer's default falls back to the
//! record's place, `topic/partition@offset`, which covers redeliveries of
//! one record but not a producer that sends the same content twice: set an
//! `Idempotency-Key` header in producers, or read the key from the payload
//! with a [`KeyExtractor`](idem_consumer::KeyExtractor).
//!
//! ## Start-up checks
//!
//! - every topic must exist;
//! - record retention must exceed each topic's `retention.ms` (how long a
//!   record, and so its redelivery after an offset reset, can come back);
//!   a topic that keeps records without limit (`retention.ms=-1`, or
//!   compaction without deletion) is refused. When the broker does not
//!   report the setting, the check is skipped with a warning; when offsets
//!   are never rewound further than some bound, state that bound with
//!   [`KafkaConsumerBuilder::assume_redelivery_window`] instead;
//! - settings that would commit before processing
//!   (`enable.auto.offset.store=true`) or stop commits
//!   (`enable.auto.commit=false`) are refused.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, Scope};
//! use idem_consumer::{Consumer, KeyExtractor};
//! use idem_kafka::KafkaConsumer;
//!
//! let store = idem_redis::RedisStore::builder("redis://127.0.0.1:6379")?
//!     .connect()
//!     .await?;
//! let idem = Idempotency::builder(store)
//!     .retention(std::time::Duration::from_secs(8 * 24 * 3600))
//!     .build()?;
//! let consumer = Consumer::builder(idem, Scope::new("billing")?)
//!     .keys(KeyExtractor::header("Idempotency-Key"))
//!     .build();
//! let kafka = KafkaConsumer::builder("127.0.0.1:9092", "billing", &["orders"], consumer)
//!     .connect()
//!     .await?;
//! kafka
//!     .run(
//!         |job| async move {
//!             let order: serde_json::Value = job.json()?;
//!             Ok::<_, idem::Terminal>(order["id"].clone())
//!         },
//!         async { tokio::signal::ctrl_c().await.ok(); },
//!     )
//!     .await?;
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use idem::{ClaimMany, ClaimedAhead, Codec, Key, Store};
use idem_consumer::{Consumer, DeadLetter, Disposition, Job, RedeliveryWindow, Stopped};
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::error::{KafkaError as RdKafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::Message as _;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

mod lane;
mod message;

use lane::{GroupContext, Kafka, LaneState, LogContext, Partition};
pub use message::KafkaMessage;

/// Header with the topic a dead-lettered record was read from.
pub const SOURCE_TOPIC_HEADER: &str = "Idem-Source-Topic";
/// Header with the partition a dead-lettered record was read from.
pub const SOURCE_PARTITION_HEADER: &str = "Idem-Source-Partition";
/// Header with the offset of a dead-lettered record.
pub const SOURCE_OFFSET_HEADER: &str = "Idem-Source-Offset";

/// The suffix of a topic's default dead-letter topic.
pub const DEAD_LETTER_SUFFIX: &str = ".dead";
/// How many records wait in a lane before its partition is paused.
/// librdkafka drops what it prefetched for a paused partition and fetches
/// it again on resume, so pausing often costs throughput: measured on
/// Tansu, 256 gave a fifth of the rate of 2,048 (BENCHMARKS.md).
pub const DEFAULT_MAX_BUFFERED: usize = 2048;
/// How long start-up waits for the broker's metadata and admin answers.
pub const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dead-letter copy may take before it counts as failed (and
/// is tried again).
const DEAD_LETTER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a lane waits before trying a failed dead-letter copy again.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(2);
/// How long the dispatcher waits after the stream reports an error.
const STREAM_BACKOFF: Duration = Duration::from_millis(200);

/// Settings idem-kafka sets itself, and the value each must keep.
const OWNED_SETTINGS: [(&str, &str, &str); 2] = [
    (
        "enable.auto.offset.store",
        "false",
        "it would store, and commit, offsets of records before they are processed",
    ),
    (
        "enable.auto.commit",
        "true",
        "idem-kafka relies on librdkafka to commit the offsets it stores after processing",
    ),
];

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

/// Builds a [`KafkaConsumer`].
pub struct KafkaConsumerBuilder<S, C> {
    common: Vec<(String, String)>,
    consumer_only: Vec<(String, String)>,
    producer_only: Vec<(String, String)>,
    group: String,
    topics: Vec<String>,
    consumer: Consumer<S, C>,
    dead_letters: HashMap<String, String>,
    assumed_window: Option<Duration>,
    max_buffered: usize,
    order: PartitionOrder,
    ahead: Option<(usize, Ahead)>,
    setup_timeout: Duration,
}

impl<S: Store, C: Codec> KafkaConsumerBuilder<S, C> {
    /// Sets a librdkafka setting on both the consumer and the dead-letter
    /// producer (connection and security settings: `security.protocol`,
    /// `sasl.*`, `ssl.*`, `client.id`).
    #[must_use]
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.common.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka setting on the consumer only (for example
    /// `session.timeout.ms`, `auto.offset.reset`,
    /// `partition.assignment.strategy`). Defaults differing from
    /// librdkafka's: `auto.offset.reset=earliest`, so a new group starts at
    /// the first record rather than skipping those already in the topic.
    #[must_use]
    pub fn consumer_set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.consumer_only.push((key.into(), value.into()));
        self
    }

    /// Sets a librdkafka setting on the dead-letter producer only.
    #[must_use]
    pub fn producer_set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer_only.push((key.into(), value.into()));
        self
    }

    /// Sends records of `topic` that are dead-lettered to `dead_letter`
    /// (default `<topic>.dead`).
    #[must_use]
    pub fn dead_letter_topic(
        mut self,
        topic: impl Into<String>,
        dead_letter: impl Into<String>,
    ) -> Self {
        self.dead_letters.insert(topic.into(), dead_letter.into());
        self
    }

    /// Checks record retention against `window` instead of the topics'
    /// `retention.ms`: for deployments that never rewind a group's offsets
    /// further back than `window`, or whose broker does not report its
    /// settings. A record redelivered later than `window` after its first
    /// delivery could find its idempotency record gone and run again.
    #[must_use]
    pub fn assume_redelivery_window(mut self, window: Duration) -> Self {
        self.assumed_window = Some(window);
        self
    }

    /// How many records may wait in one partition's lane before the
    /// partition is paused (default [`DEFAULT_MAX_BUFFERED`]).
    #[must_use]
    pub fn max_buffered_per_partition(mut self, records: usize) -> Self {
        self.max_buffered = records.max(1);
        self
    }

    /// How the records of one partition may overlap (default
    /// [`PartitionOrder::Offsets`]: one at a time).
    /// [`PartitionOrder::Keys`] keeps the order of each record key only,
    /// and runs different keys concurrently: for handlers whose effects
    /// only need per-entity order, and topics with few partitions.
    #[must_use]
    pub fn partition_order(mut self, order: PartitionOrder) -> Self {
        self.order = order;
        self
    }

    /// How long start-up waits for the broker (default
    /// [`DEFAULT_SETUP_TIMEOUT`]).
    #[must_use]
    pub fn setup_timeout(mut self, timeout: Duration) -> Self {
        self.setup_timeout = timeout;
        self
    }

    /// Creates the clients, checks the topics and the retention, creates
    /// missing dead-letter topics, and joins the group.
    pub async fn connect(self) -> Result<KafkaConsumer<S, C>, KafkaConsumerError> {
        if self.topics.is_empty() {
            return Err(KafkaConsumerError::NoTopics);
        }
        let mut consumer_config = ClientConfig::new();
        consumer_config
            .set("group.id", &self.group)
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        let mut producer_config = ClientConfig::new();
        producer_config
            .set("acks", "all")
            .set("message.timeout.ms", "15000");
        let mut admin_config = ClientConfig::new();
        for (key, value) in &self.common {
            consumer_config.set(key, value);
            producer_config.set(key, value);
            admin_config.set(key, value);
        }
        for (key, value) in &self.consumer_only {
            consumer_config.set(key, value);
        }
        for (key, value) in &self.producer_only {
            producer_config.set(key, value);
        }
        for (setting, required, why) in OWNED_SETTINGS {
            if let Some(value) = consumer_config.get(setting) {
                if value != required {
                    return Err(KafkaConsumerError::Setting {
                        setting: setting.to_owned(),
                        value: value.to_owned(),
                        why,
                    });
                }
            }
            consumer_config.set(setting, required);
        }
        let kafka = Kafka::from_config_and_context(&consumer_config, GroupContext::default())
            .map_err(|source| KafkaConsumerError::Client {
                which: "consumer",
                source,
            })?;
        let kafka = Arc::new(kafka);
        let producer = FutureProducer::from_config_and_context(&producer_config, LogContext)
            .map_err(|source| KafkaConsumerError::Client {
                which: "producer",
                source,
            })?;
        let admin =
            AdminClient::from_config_and_context(&admin_config, LogContext).map_err(|source| {
                KafkaConsumerError::Client {
                    which: "admin client",
                    source,
                }
            })?;
        let setup = Setup {
            kafka: Arc::clone(&kafka),
            admin: &admin,
            timeout: self.setup_timeout,
        };
        let mut dead_letters = HashMap::new();
        for topic in &self.topics {
            let partitions = setup.partitions(topic).await?;
            let dead = self
                .dead_letters
                .get(topic)
                .cloned()
                .unwrap_or_else(|| format!("{topic}{DEAD_LETTER_SUFFIX}"));
            setup.ensure_dead_letter_topic(&dead, partitions).await?;
            dead_letters.insert(topic.clone(), dead);
        }
        let windows = match self.assumed_window {
            Some(window) => self
                .topics
                .iter()
                .map(|t| {
                    RedeliveryWindow::new(format!("the assumed redelivery window of {t:?}"), window)
                })
                .collect(),
            None => setup.retention_windows(&self.topics).await,
        };
        self.consumer.check_windows(&windows)?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        kafka
            .subscribe(&topics)
            .map_err(|source| KafkaConsumerError::Broker {
                what: format!("subscribing to {topics:?}"),
                source,
            })?;
        Ok(KafkaConsumer {
            shared: Arc::new(Shared {
                kafka,
                producer,
                consumer: self.consumer,
                dead_letters,
                max_buffered: self.max_buffered,
                order: self.order,
                // Claims made ahead serve only one-at-a-time lanes.
                ahead: self.ahead.filter(|_| self.order == PartitionOrder::Offsets),
            }),
        })
    }
}

impl<S, C> KafkaConsumerBuilder<S, C>
where
    S: ClaimMany + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// In offset order, claims up to `batch` of a partition's waiting
    /// records in one round trip (the store's `claim_many`) instead of one
    /// claim per record; each record still runs, completes and commits one
    /// at a time, in order. A claim is renewed when its record starts; one
    /// that waited past its lease and was taken over by another worker
    /// meanwhile does not run here (the record is retried in place and
    /// meets that worker's claim), so keep `batch` × the longest handler
    /// under the lease. Ignored under [`PartitionOrder::Keys`].
    #[must_use]
    pub fn claim_ahead(mut self, batch: usize) -> Self {
        let consumer = self.consumer.clone();
        let claim: Ahead = Arc::new(move |records| {
            let consumer = consumer.clone();
            Box::pin(async move { consumer.claim_ahead(&records).await })
        });
        self.ahead = Some((batch.max(1), claim));
        self
    }
}

/// The start-up questions to the broker.
struct Setup<'a> {
    kafka: Arc<Kafka>,
    admin: &'a AdminClient<LogContext>,
    timeout: Duration,
}

impl Setup<'_> {
    /// How many partitions `topic` has; an error when it does not exist.
    async fn partitions(&self, topic: &str) -> Result<usize, KafkaConsumerError> {
        let (kafka, timeout, name) = (Arc::clone(&self.kafka), self.timeout, topic.to_owned());
        let metadata = blocking(move || kafka.fetch_metadata(Some(&name), timeout))
            .await
            .map_err(|source| KafkaConsumerError::Broker {
                what: format!("reading the metadata of topic {topic:?}"),
                source,
            })?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        match found {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                Ok(t.partitions().len())
            }
            Some(t) => Err(KafkaConsumerError::TopicMissing {
                topic: topic.to_owned(),
                code: t
                    .error()
                    .map_or(RDKafkaErrorCode::UnknownTopicOrPartition, Into::into),
            }),
            None => Err(KafkaConsumerError::TopicMissing {
                topic: topic.to_owned(),
                code: RDKafkaErrorCode::UnknownTopicOrPartition,
            }),
        }
    }

    async fn ensure_dead_letter_topic(
        &self,
        topic: &str,
        partitions: usize,
    ) -> Result<(), KafkaConsumerError> {
        if self.partitions(topic).await.is_ok() {
            return Ok(());
        }
        let count = i32::try_from(partitions).unwrap_or(i32::MAX);
        let new = NewTopic::new(topic, count, TopicReplication::Fixed(-1));
        let options = AdminOptions::new().operation_timeout(Some(self.timeout));
        let failed = |detail: String| KafkaConsumerError::DeadLetterTopic {
            topic: topic.to_owned(),
            detail,
        };
        let results = self
            .admin
            .create_topics([&new], &options)
            .await
            .map_err(|e| failed(e.to_string()))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(failed(code.to_string())),
            }
        }
        tracing::info!(topic, partitions, "created the dead-letter topic");
        Ok(())
    }

    /// Each topic's `retention.ms` (and `cleanup.policy`) as a redelivery
    /// window; topics whose settings the broker does not report are left
    /// out, with a warning.
    async fn retention_windows(&self, topics: &[String]) -> Vec<RedeliveryWindow> {
        let specifiers: Vec<ResourceSpecifier<'_>> = topics
            .iter()
            .map(|t| ResourceSpecifier::Topic(t.as_str()))
            .collect();
        let options = AdminOptions::new().request_timeout(Some(self.timeout));
        let described = self.admin.describe_configs(&specifiers, &options).await;
        let mut windows = Vec::new();
        for (i, topic) in topics.iter().enumerate() {
            let resource = match &described {
                Ok(results) => results.get(i).and_then(|r| r.as_ref().ok()),
                Err(_) => None,
            };
            let setting = |name: &str| {
                resource
                    .and_then(|r| r.get(name))
                    .and_then(|e| e.value.clone())
            };
            if let Some(policy) = setting("cleanup.policy") {
                if !policy.split(',').any(|p| p.trim() == "delete") {
                    windows.push(RedeliveryWindow::unbounded(format!(
                        "topic {topic:?} cleanup.policy={policy}"
                    )));
                    continue;
                }
            }
            match setting("retention.ms").map(|v| v.parse::<i64>()) {
                Some(Ok(ms)) if ms < 0 => windows.push(RedeliveryWindow::unbounded(format!(
                    "topic {topic:?} retention.ms={ms}"
                ))),
                Some(Ok(ms)) => windows.push(RedeliveryWindow::new(
                    format!("topic {topic:?} retention.ms"),
                    Duration::from_millis(ms.unsigned_abs()),
                )),
                _ => tracing::warn!(
                    topic,
                    "the broker does not report the topic's retention.ms; record retention is \
                     not checked against it (see assume_redelivery_window)"
                ),
            }
        }
        windows
    }
}

/// A Kafka consumer-group member that gives each record's effect exactly
/// once: see the [crate documentation](crate).
pub struct KafkaConsumer<S, C> {
    shared: Arc<Shared<S, C>>,
}

struct Shared<S, C> {
    kafka: Arc<Kafka>,
    producer: FutureProducer<LogContext>,
    consumer: Consumer<S, C>,
    dead_letters: HashMap<String, String>,
    max_buffered: usize,
    order: PartitionOrder,
    ahead: Option<(usize, Ahead)>,
}

/// Claims records ahead of their runs, in one round trip.
type Ahead = Arc<
    dyn Fn(Vec<Arc<KafkaMessage>>) -> BoxFuture<'static, Vec<Option<ClaimedAhead>>> + Send + Sync,
>;

/// A lane as the dispatcher holds it.
struct LaneHandle {
    state: Arc<LaneState>,
    records: mpsc::UnboundedSender<KafkaMessage>,
}

impl<S: Store, C: Codec> KafkaConsumer<S, C> {
    /// A consumer in group `group` reading `topics` from the brokers
    /// `bootstrap` (`host:port[,host:port…]`).
    pub fn builder(
        bootstrap: &str,
        group: &str,
        topics: &[&str],
        consumer: Consumer<S, C>,
    ) -> KafkaConsumerBuilder<S, C> {
        KafkaConsumerBuilder {
            common: vec![("bootstrap.servers".to_owned(), bootstrap.to_owned())],
            consumer_only: Vec::new(),
            producer_only: Vec::new(),
            group: group.to_owned(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            consumer,
            dead_letters: HashMap::new(),
            assumed_window: None,
            max_buffered: DEFAULT_MAX_BUFFERED,
            order: PartitionOrder::Offsets,
            ahead: None,
            setup_timeout: DEFAULT_SETUP_TIMEOUT,
        }
    }

    /// The consumer layer (for its [`stats`](Consumer::stats)).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.shared.consumer
    }

    /// The dead-letter topic of `topic`.
    pub fn dead_letter_topic(&self, topic: &str) -> Option<&str> {
        self.shared.dead_letters.get(topic).map(String::as_str)
    }

    /// Consumes until `shutdown` resolves (or the stream ends). Then it
    /// takes no more records, lets every running handler finish and store
    /// its offset, commits, and leaves the group; records it held but had
    /// not started are delivered again to the group.
    pub async fn run<T, E, H, Fut>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Stopped, KafkaConsumerError>
    where
        S: Send + Sync + 'static,
        C: Send + Sync + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
        H: Fn(Job<KafkaMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let (stop, stopping) = watch::channel(false);
        let mut lanes: HashMap<Partition, LaneHandle> = HashMap::new();
        let mut workers = JoinSet::new();
        let shared = Arc::clone(&self.shared);
        let mut records = shared.kafka.stream();
        tokio::pin!(shutdown);
        let stopped = loop {
            tokio::select! {
                () = &mut shutdown => break Stopped::Shutdown,
                Some(_) = workers.join_next(), if !workers.is_empty() => {}
                next = records.next() => match next {
                    None => break Stopped::Ended,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "Kafka consumer error");
                        tokio::time::sleep(STREAM_BACKOFF).await;
                    }
                    Some(Ok(record)) => {
                        let record = KafkaMessage::new(record.detach());
                        let partition = (record.topic().to_owned(), record.partition());
                        let Some(state) = shared.kafka.context().lane(&partition) else {
                            // Left over from before a rebalance: not ours.
                            continue;
                        };
                        let current = lanes
                            .get(&partition)
                            .is_some_and(|h| Arc::ptr_eq(&h.state, &state));
                        if !current {
                            let (tx, rx) = mpsc::unbounded_channel();
                            workers.spawn(lane(
                                Arc::clone(&shared),
                                partition.clone(),
                                Arc::clone(&state),
                                rx,
                                Arc::clone(&handler),
                                stopping.clone(),
                            ));
                            lanes.insert(partition.clone(), LaneHandle { state, records: tx });
                        }
                        let handle = &lanes[&partition];
                        handle.state.queued(&shared.kafka, &partition, shared.max_buffered);
                        // A lane that ended has dropped its receiver; the
                        // record is delivered again to the partition's
                        // owner.
                        let _ = handle.records.send(record);
                    }
                },
            }
        };
        drop(records);
        let _ = stop.send(true);
        drop(lanes);
        while workers.join_next().await.is_some() {}
        let kafka = Arc::clone(&self.shared.kafka);
        match blocking(move || kafka.commit_consumer_state(CommitMode::Sync)).await {
            Ok(()) | Err(RdKafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => tracing::warn!(%error, "final commit failed; the group redelivers \
                 (and replays) the records after the last commit"),
        }
        self.shared.kafka.unsubscribe();
        Ok(stopped)
    }
}

/// Runs a blocking librdkafka call off the async workers.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, RdKafkaError> + Send + 'static,
) -> Result<T, RdKafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or(Err(RdKafkaError::Canceled))
}

/// One partition's worker: see the `lane` module. Records join a chain
/// (the whole partition, or their record key under
/// [`PartitionOrder::Keys`]); each chain runs one record at a time, in
/// offset order, and the stored offset is the lowest record not yet
/// settled.
async fn lane<S, C, T, E, H, Fut>(
    shared: Arc<Shared<S, C>>,
    partition: Partition,
    state: Arc<LaneState>,
    mut records: mpsc::UnboundedReceiver<KafkaMessage>,
    handler: Arc<H>,
    stop: watch::Receiver<bool>,
) where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: StdError + Send + Sync + 'static,
    H: Fn(Job<KafkaMessage>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    let low_water = shared.max_buffered / 2;
    let window = shared
        .ahead
        .as_ref()
        .map_or(shared.order.window(), |(batch, _)| *batch);
    let mut unsettled: BTreeSet<i64> = BTreeSet::new();
    let mut chains: HashMap<Chain, VecDeque<Queued>> = HashMap::new();
    let mut running: JoinSet<(Chain, i64, bool)> = JoinSet::new();
    let mut taken_up_to = None;
    let mut stored = None;
    let start = |queued: Queued, chain: Chain, running: &mut JoinSet<_>| {
        let (shared, state, handler, stop) = (
            Arc::clone(&shared),
            Arc::clone(&state),
            Arc::clone(&handler),
            stop.clone(),
        );
        running.spawn(async move {
            let offset = queued.record.offset();
            let settled = shared.settle(queued, &*handler, &state, &stop).await;
            (chain, offset, settled)
        });
    };
    let mut ended = false;
    while !ended || !running.is_empty() {
        tokio::select! {
            // A lane revoked while idle ends here rather than waiting for
            // a record that will never come.
            () = state.revoked(), if !ended => ended = true,
            record = records.recv(), if !ended && unsettled.len() < window => {
                let Some(record) = record else {
                    ended = true;
                    continue;
                };
                state.taken(&shared.kafka, &partition, low_water);
                if state.ended(&stop) {
                    ended = true;
                    continue;
                }
                let record = Arc::new(record);
                unsettled.insert(record.offset());
                taken_up_to = Some(record.offset() + 1);
                let chain = shared.order.chain(&record);
                let queue = chains.entry(chain.clone()).or_default();
                queue.push_back(Queued { record, ahead: None });
                if queue.len() == 1 {
                    start(queue[0].take(), chain, &mut running);
                }
            }
            Some(done) = running.join_next(), if !running.is_empty() => {
                let Ok((chain, offset, settled)) = done else {
                    ended = true;
                    continue;
                };
                if !settled {
                    // The lane ended during a retry wait: the record stays
                    // unsettled and uncommitted.
                    ended = true;
                    continue;
                }
                unsettled.remove(&offset);
                if let Some(queue) = chains.get_mut(&chain) {
                    queue.pop_front();
                    if queue.is_empty() || ended {
                        chains.remove(&chain);
                    } else {
                        if let Some((batch, claim)) = &shared.ahead {
                            claim_waiting(queue, *batch, claim).await;
                        }
                        start(queue[0].take(), chain, &mut running);
                    }
                }
                let next = unsettled.first().copied().or(taken_up_to);
                if next > stored && !state.is_revoked() {
                    stored = next;
                    let list = lane::list(&partition, next);
                    if let Err(error) = shared.kafka.store_offsets(&list) {
                        tracing::debug!(%error, topic = %partition.0, partition = partition.1,
                            "offset not stored (partition no longer assigned)");
                    }
                }
            }
        }
    }
}

/// A record waiting in its chain, with the claim made ahead for it.
struct Queued {
    record: Arc<KafkaMessage>,
    ahead: Option<ClaimedAhead>,
}

impl Queued {
    /// The record and its claim, leaving the claim behind empty (the
    /// record stays queued until it is settled).
    fn take(&mut self) -> Queued {
        Queued {
            record: Arc::clone(&self.record),
            ahead: self.ahead.take(),
        }
    }
}

/// Claims, in one round trip, up to `batch` records at the front of
/// `queue` that wait without a claim, when there are at least two (one
/// is claimed as well by its own run).
async fn claim_waiting(queue: &mut VecDeque<Queued>, batch: usize, claim: &Ahead) {
    if queue.front().is_some_and(|q| q.ahead.is_some()) {
        return;
    }
    let waiting: Vec<usize> = (0..queue.len())
        .filter(|&i| queue[i].ahead.is_none())
        .take(batch)
        .collect();
    if waiting.len() < 2 {
        return;
    }
    let records = waiting
        .iter()
        .map(|&i| Arc::clone(&queue[i].record))
        .collect();
    for (i, claimed) in waiting.into_iter().zip(claim(records).await) {
        queue[i].ahead = claimed;
    }
}

/// Records that must not overlap: under [`PartitionOrder::Offsets`] the
/// whole partition, under [`PartitionOrder::Keys`] one record key (a record
/// without a key overlaps with anything).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Chain {
    Partition,
    Key(Vec<u8>),
    Alone(i64),
}

/// How the records of one partition may overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionOrder {
    /// One record at a time, in offset order: the partition's order is
    /// the order of effects (the default).
    Offsets,
    /// Records with different record keys run concurrently, up to
    /// `max_in_flight` of the partition at once; records with the same key
    /// run one at a time in offset order (a record waiting for a retry
    /// holds back only its key). Records without a key have no order. The
    /// committed offset still never passes an unsettled record.
    Keys {
        /// How many records of one partition may be taken at once.
        max_in_flight: usize,
    },
}

impl PartitionOrder {
    fn window(self) -> usize {
        match self {
            PartitionOrder::Offsets => 1,
            PartitionOrder::Keys { max_in_flight } => max_in_flight.max(1),
        }
    }

    fn chain(self, record: &KafkaMessage) -> Chain {
        match (self, record.record_key()) {
            (PartitionOrder::Offsets, _) => Chain::Partition,
            (PartitionOrder::Keys { .. }, Some(key)) => Chain::Key(key.to_vec()),
            (PartitionOrder::Keys { .. }, None) => Chain::Alone(record.offset()),
        }
    }
}

impl<S: Store, C: Codec> Shared<S, C> {
    /// Runs `record` until it is acked or dead-lettered (true), retrying
    /// in place; false when the lane ended first.
    async fn settle<T, E, H, Fut>(
        &self,
        queued: Queued,
        handler: &H,
        state: &LaneState,
        stop: &watch::Receiver<bool>,
    ) -> bool
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        H: Fn(Job<KafkaMessage>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let Queued { record, mut ahead } = queued;
        loop {
            let decision = match ahead.take() {
                Some(claimed) => {
                    self.consumer
                        .process_claimed(Arc::clone(&record), claimed, handler)
                        .await
                }
                None => self.consumer.process(Arc::clone(&record), handler).await,
            };
            let after = match decision.disposition {
                Disposition::Ack(_) => return true,
                Disposition::DeadLetter { reason } => {
                    return self
                        .dead_letter(&record, decision.key.as_ref(), &reason, state, stop)
                        .await;
                }
                Disposition::Retry { after, .. } => after,
                other => {
                    tracing::error!(?other, "unknown disposition; retrying the record");
                    self.consumer.max_retry_delay()
                }
            };
            if !state.sleep(after, stop).await {
                return false;
            }
        }
    }
}

impl<S: Store, C: Codec> Shared<S, C> {
    /// Produces the dead-letter copy of `record` and waits for the broker
    /// to acknowledge it, trying again until it does; false when the lane
    /// ended first (the record stays uncommitted and is delivered again).
    async fn dead_letter(
        &self,
        record: &KafkaMessage,
        key: Option<&Key>,
        reason: &str,
        state: &LaneState,
        stop: &watch::Receiver<bool>,
    ) -> bool {
        let Some(topic) = self.dead_letters.get(record.topic()) else {
            tracing::error!(
                topic = record.topic(),
                "no dead-letter topic for this topic"
            );
            return false;
        };
        let (partition, offset) = (record.partition().to_string(), record.offset().to_string());
        loop {
            let mut headers = OwnedHeaders::new();
            for (name, value) in record.headers() {
                headers = headers.insert(Header { key: name, value });
            }
            let letter = DeadLetter {
                reason,
                key,
                consumer: self.consumer.name(),
            }
            .headers();
            let source = [
                (SOURCE_TOPIC_HEADER, record.topic()),
                (SOURCE_PARTITION_HEADER, partition.as_str()),
                (SOURCE_OFFSET_HEADER, offset.as_str()),
            ];
            let added = letter.iter().map(|(name, value)| (*name, value.as_str()));
            for (name, value) in added.chain(source) {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
            let mut copy: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
            if let Some(payload) = record.as_rdkafka().payload() {
                copy = copy.payload(payload);
            }
            if let Some(record_key) = record.record_key() {
                copy = copy.key(record_key);
            }
            match self
                .producer
                .send(copy, Timeout::After(DEAD_LETTER_TIMEOUT))
                .await
            {
                Ok(_) => return true,
                Err((error, _)) => tracing::warn!(
                    %error, dead_letter_topic = %topic,
                    "dead-letter copy failed; trying again"
                ),
            }
            if !state.sleep(DEAD_LETTER_RETRY, stop).await {
                return false;
            }
        }
    }
}
