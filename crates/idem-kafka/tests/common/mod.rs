//! What the Kafka tests share: the broker (Tansu, started for this test
//! run on a free loopback port), a redis-server for the store, topics, a
//! producer, and worker processes to kill.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idem::outbox::Sender;
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, KeyExtractor};
use idem_kafka::{
    KafkaConsumer, KafkaSender, CONSUMER_HEADER, KEY_HEADER, REASON_HEADER, SOURCE_OFFSET_HEADER,
    SOURCE_TOPIC_HEADER,
};
use idem_redis::RedisStore;
use idem_testkit::consumers::ledger::{Ledger, Work};
use idem_testkit::consumers::under_test::{BrokerUnderTest, ChaosBroker, DeadLetterSeen};
use idem_testkit::servers::kafka::KafkaServer;
use idem_testkit::servers::redis::RedisServer;
use idem_testkit::ServerError;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

pub(crate) fn bootstrap() -> String {
    KafkaServer::shared()
        .expect("tansu must be installed (scripts/test installs it)")
        .bootstrap()
}

pub(crate) fn redis() -> &'static RedisServer {
    RedisServer::shared().expect("redis-server")
}

/// Creates `topic` with `partitions` partitions and these settings.
pub(crate) async fn create_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    settings: &[(&str, &str)],
) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    for (key, value) in settings {
        new = new.set(key, value);
    }
    let created = admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create topic");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
}

/// The settings a test and its workers share.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) topic: String,
    pub(crate) bootstrap: String,
    pub(crate) redis_url: String,
    pub(crate) ledger: Ledger,
    /// A chaos run's worker slot: its consumers are static group members
    /// of that name (see [`Setup::kafka_with`]).
    pub(crate) member: Option<String>,
}

impl Setup {
    /// A topic with `partitions` partitions and a one-hour retention.
    pub(crate) async fn new(name: &str, partitions: i32) -> Self {
        Self::new_at(name, partitions, bootstrap(), redis().url()).await
    }

    async fn new_at(name: &str, partitions: i32, bootstrap: String, redis_url: String) -> Self {
        let topic = format!("{name}-{:08x}", rand::random::<u32>());
        create_topic(
            &bootstrap,
            &topic,
            partitions,
            &[("retention.ms", "3600000")],
        )
        .await;
        Self {
            ledger: Ledger::create(&topic),
            topic,
            bootstrap,
            redis_url,
            member: None,
        }
    }

    pub(crate) fn group(&self) -> String {
        format!("{}-group", self.topic)
    }

    pub(crate) fn dead_letter_topic(&self) -> String {
        format!("{}.dead", self.topic)
    }

    pub(crate) async fn store(&self) -> RedisStore {
        RedisStore::builder(&self.redis_url)
            .expect("valid URL")
            .namespace(self.topic.clone())
            .connect()
            .await
            .expect("connect to redis")
    }

    /// The executor tests and workers run: short leases, so a killed
    /// worker's claims are taken over within seconds.
    #[allow(dead_code)] // the chaos run builds its own
    pub(crate) async fn idem(&self) -> Idempotency<RedisStore> {
        idem_testkit::consumers::scenario::executor(self.store().await)
    }

    /// The consumer layer, keyed only by the `Idempotency-Key` header: a
    /// record without one is dead-lettered.
    #[allow(dead_code)] // the chaos run builds its own
    pub(crate) async fn consumer(&self) -> Consumer<RedisStore> {
        self.consumer_with(self.idem().await)
    }

    /// [`consumer`](Self::consumer) with the executor `idem`.
    fn consumer_with(&self, idem: Idempotency<RedisStore>) -> Consumer<RedisStore> {
        Consumer::builder(idem, Scope::new("orders").expect("scope"))
            .keys(KeyExtractor::header("Idempotency-Key"))
            .retry_delay(Duration::from_millis(50), Duration::from_secs(2))
            .build()
    }

    /// A group member with the short session timeout Tansu is tested with.
    #[allow(dead_code)] // the chaos run builds its own
    pub(crate) async fn kafka(&self) -> KafkaConsumer<RedisStore, idem::Json> {
        self.kafka_with(self.consumer().await).await
    }

    /// [`kafka`](Self::kafka) with the consumer layer `consumer`.
    ///
    /// A chaos run's worker is a static member (`group.instance.id`
    /// named after its slot): its replacement takes its partitions without
    /// a rebalance. Tansu 0.6's group coordinator can lose a group for
    /// good under churn — a leader that left or timed out stays the
    /// leader of every later generation, so no member is ever assigned a
    /// partition — and a run with a rebalance at every kill, stop and
    /// leave, in two groups per worker, met that often enough to fail the
    /// suite now and then. Static members' joins and syncs wait 3 s each
    /// on Tansu without a heartbeat, hence their longer session. The
    /// worker-kill scenario keeps dynamic members and their rebalances.
    pub(crate) async fn kafka_with(
        &self,
        consumer: Consumer<RedisStore>,
    ) -> KafkaConsumer<RedisStore, idem::Json> {
        let builder =
            KafkaConsumer::builder(&self.bootstrap, &self.group(), &[&self.topic], consumer)
                .consumer_set("heartbeat.interval.ms", "500")
                .consumer_set("auto.commit.interval.ms", "200");
        let builder = match &self.member {
            Some(member) => builder
                .consumer_set("group.instance.id", format!("{}-{member}", self.group()))
                .consumer_set("session.timeout.ms", "20000"),
            None => builder.consumer_set("session.timeout.ms", "6000"),
        };
        builder.connect().await.expect("connect to Kafka")
    }

    pub(crate) fn producer(&self) -> Producer {
        Producer(
            ClientConfig::new()
                .set("bootstrap.servers", &self.bootstrap)
                .create()
                .expect("producer"),
        )
    }

    /// Partition → (committed offset, end of the log) for the group.
    pub(crate) fn progress(&self, partitions: i32) -> BTreeMap<i32, (i64, i64)> {
        let reader: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", self.group())
            .create()
            .expect("consumer");
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(&self.topic, p);
        }
        let committed = reader
            .committed_offsets(list, Duration::from_secs(5))
            .expect("committed offsets");
        (0..partitions)
            .map(|p| {
                let at = match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(n)) => n,
                    _ => 0,
                };
                let (_, end) = reader
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(5))
                    .expect("watermarks");
                (p, (at, end))
            })
            .collect()
    }

    /// Waits until the group's committed offset reaches the end of every
    /// partition.
    pub(crate) async fn caught_up(&self, partitions: i32) -> bool {
        for _ in 0..150 {
            if self
                .progress(partitions)
                .values()
                .all(|(at, end)| at == end)
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }
}

/// A Tansu of the run's own, advertising the loopback port the run's
/// fault proxy will listen on, and that port.
pub(crate) struct ChaosServer {
    server: KafkaServer,
    advertised: u16,
}

impl ChaosBroker for Setup {
    type Server = ChaosServer;
    type Store = RedisStore;

    /// Tansu is tested with in-memory storage, which a restart empties.
    const RESTARTS: bool = false;

    fn start_server() -> Result<ChaosServer, ServerError> {
        let advertised = idem_testkit::free_port()?;
        Ok(ChaosServer {
            server: KafkaServer::start_advertising(Some(advertised))?,
            advertised,
        })
    }

    fn port(server: &ChaosServer) -> u16 {
        server.server.port()
    }

    fn advertised_port(server: &ChaosServer) -> Option<u16> {
        Some(server.advertised)
    }

    fn restart(_server: &mut ChaosServer) -> Result<(), ServerError> {
        Err(ServerError::Failed {
            what: "Tansu's in-memory storage keeps nothing across a restart".into(),
        })
    }

    async fn create_at(name: &str, broker_port: u16, store_url: &str) -> Self {
        Self::new_at(
            name,
            SCENARIO_PARTITIONS,
            format!("127.0.0.1:{broker_port}"),
            store_url.to_owned(),
        )
        .await
    }

    fn through(&self, broker_port: u16, store_url: &str) -> Self {
        Self {
            bootstrap: format!("127.0.0.1:{broker_port}"),
            redis_url: store_url.to_owned(),
            ..self.clone()
        }
    }

    async fn store(&self) -> RedisStore {
        Setup::store(self).await
    }

    fn output(&self) -> Self {
        Self {
            topic: format!("{}-out", self.topic),
            ledger: self.ledger.output(),
            ..self.clone()
        }
    }

    async fn declare(&self) {
        create_topic(
            &self.bootstrap,
            &self.topic,
            SCENARIO_PARTITIONS,
            &[("retention.ms", "3600000")],
        )
        .await;
    }

    fn address(&self) -> String {
        self.topic.clone()
    }

    async fn sender(&self) -> Arc<dyn Sender> {
        Arc::new(KafkaSender::new(&self.bootstrap).expect("a Kafka producer"))
    }
}

/// The partitions of the worker-kill scenario's topic.
const SCENARIO_PARTITIONS: i32 = 3;

impl BrokerUnderTest for Setup {
    async fn create(name: &str) -> Self {
        Self::new(name, SCENARIO_PARTITIONS).await
    }

    fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok();
        Some(Self {
            topic: var("IDEM_KAFKA_TOPIC")?,
            bootstrap: var("IDEM_KAFKA_BOOTSTRAP")?,
            redis_url: var("IDEM_KAFKA_REDIS")?,
            ledger: Ledger::at(PathBuf::from(var("IDEM_KAFKA_DIR")?)),
            member: idem_testkit::consumers::scenario::member(),
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_KAFKA_TOPIC", self.topic.clone()),
            ("IDEM_KAFKA_BOOTSTRAP", self.bootstrap.clone()),
            ("IDEM_KAFKA_REDIS", self.redis_url.clone()),
            (
                "IDEM_KAFKA_DIR",
                self.ledger.dir().to_string_lossy().into_owned(),
            ),
        ]
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    async fn publish(&self, key: Option<&str>, payload: &str) {
        self.producer().send(&self.topic, key, payload, None).await;
    }

    async fn consume(&self, work: Work, shutdown: impl Future<Output = ()> + Send + 'static) {
        let (idem, _dispatcher) = idem_testkit::consumers::scenario::executor_for(
            &work,
            self.store().await,
            &self.ledger,
        );
        self.kafka_with(self.consumer_with(idem))
            .await
            .run(work.handler(self.ledger.clone()), shutdown)
            .await
            .expect("consume");
    }

    /// The group committed past every record (dead-letter copies are
    /// acknowledged by the broker before their offset is committed).
    async fn settled(&self, _dead_letters: usize) -> bool {
        self.caught_up(SCENARIO_PARTITIONS).await
    }

    /// The dead-letter topic's records, each checked for the source
    /// headers Kafka adds and the original headers it keeps.
    async fn dead_letters(&self) -> Vec<DeadLetterSeen> {
        let dead = read_topic(&self.bootstrap, &self.dead_letter_topic(), usize::MAX).await;
        dead.into_iter()
            .map(|d| {
                assert_eq!(d[SOURCE_TOPIC_HEADER], self.topic);
                assert!(d[SOURCE_OFFSET_HEADER].parse::<i64>().is_ok(), "{d:?}");
                assert_eq!(
                    d.get("Idempotency-Key"),
                    d.get(KEY_HEADER),
                    "the original headers travel with the copy"
                );
                DeadLetterSeen {
                    key: d.get(KEY_HEADER).cloned(),
                    reason: d[REASON_HEADER].clone(),
                    consumer: d.get(CONSUMER_HEADER).cloned(),
                }
            })
            .collect()
    }
}

pub(crate) struct Producer(FutureProducer);

impl Producer {
    /// Sends `payload`, keyed by `Idempotency-Key` (and by record key)
    /// when given, to `partition` when given, and waits for the broker to
    /// store it.
    pub(crate) async fn send(
        &self,
        topic: &str,
        key: Option<&str>,
        payload: &str,
        partition: Option<i32>,
    ) {
        self.send_with_record_key(topic, key, key, payload, partition)
            .await;
    }

    /// [`send`](Self::send) with a record key of its own.
    pub(crate) async fn send_with_record_key(
        &self,
        topic: &str,
        key: Option<&str>,
        record_key: Option<&str>,
        payload: &str,
        partition: Option<i32>,
    ) {
        let mut headers = OwnedHeaders::new();
        if let Some(key) = key {
            headers = headers.insert(Header {
                key: "Idempotency-Key",
                value: Some(key),
            });
        }
        let mut record = FutureRecord::<str, str>::to(topic)
            .payload(payload)
            .headers(headers);
        if let Some(record_key) = record_key {
            record = record.key(record_key);
        }
        if let Some(partition) = partition {
            record = record.partition(partition);
        }
        self.0
            .send(record, Duration::from_secs(10))
            .await
            .expect("send");
    }
}

/// Every record of `topic` (read by a fresh group), as its headers by
/// name; reads until `count` arrived or ten seconds passed.
pub(crate) async fn read_topic(
    bootstrap: &str,
    topic: &str,
    count: usize,
) -> Vec<BTreeMap<String, String>> {
    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{:08x}", rand::random::<u32>()))
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("consumer");
    reader.subscribe(&[topic]).expect("subscribe");
    let mut out = Vec::new();
    let mut records = reader.stream();
    while out.len() < count {
        let Ok(Some(Ok(record))) =
            tokio::time::timeout(Duration::from_secs(10), records.next()).await
        else {
            break;
        };
        let mut headers = BTreeMap::new();
        for h in record.headers().into_iter().flat_map(|h| h.iter()) {
            let value = String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned();
            headers.insert(h.key.to_owned(), value);
        }
        out.push(headers);
    }
    out
}
