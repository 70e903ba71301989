//! [`KafkaConsumerBuilder`]: defaults, settings, and the start-up checks
//! against the brokers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem::{ClaimMany, Codec, Store};
use idem_consumer::{Consumer, RedeliveryWindow};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::consumer::Consumer as _;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::FutureProducer;

use crate::consumer::{blocking, Ahead, KafkaConsumer, Shared};
use crate::dead_letter::DEAD_LETTER_SUFFIX;
use crate::error::KafkaConsumerError;
use crate::lane::{GroupContext, Kafka, LogContext};
use crate::order::PartitionOrder;

/// How many records wait in a lane before its partition is paused.
/// librdkafka drops what it prefetched for a paused partition and fetches
/// it again on resume, so pausing often costs throughput: measured on
/// Tansu, 256 gave a fifth of the rate of 2,048 (BENCHMARKS.md).
pub const DEFAULT_MAX_BUFFERED: usize = 2048;

/// How long start-up waits for the broker's metadata and admin answers.
pub const DEFAULT_SETUP_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Builds a [`KafkaConsumer`].
pub struct KafkaConsumerBuilder<S, C> {
    pub(crate) common: Vec<(String, String)>,
    pub(crate) consumer_only: Vec<(String, String)>,
    pub(crate) producer_only: Vec<(String, String)>,
    pub(crate) group: String,
    pub(crate) topics: Vec<String>,
    pub(crate) consumer: Consumer<S, C>,
    pub(crate) dead_letters: HashMap<String, String>,
    pub(crate) assumed_window: Option<Duration>,
    pub(crate) max_buffered: usize,
    pub(crate) order: PartitionOrder,
    pub(crate) ahead: Option<(usize, Ahead)>,
    pub(crate) setup_timeout: Duration,
}

impl<S, C> std::fmt::Debug for KafkaConsumerBuilder<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConsumerBuilder")
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("consumer", &self.consumer)
            .field("order", &self.order)
            .finish_non_exhaustive()
    }
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
        self.consumer.check_send_id_keys(crate::message::MESSAGE_ID);
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
}
