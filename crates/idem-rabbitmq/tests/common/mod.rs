//! What the RabbitMQ tests share: the broker, a redis-server for the
//! store, an effects ledger on disk, and worker processes to kill.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idem::outbox::Sender;
use idem::Scope;
use idem_consumer::Consumer;
use idem_rabbitmq::{RabbitConsumer, RabbitSender, CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
use idem_redis::RedisStore;
use idem_testkit::consumers::ledger::{Ledger, Work};
use idem_testkit::consumers::under_test::{BrokerUnderTest, ChaosBroker, DeadLetterSeen};
use idem_testkit::servers::rabbitmq::RabbitServer;
use idem_testkit::servers::redis::RedisServer;
use idem_testkit::ServerError;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

pub(crate) fn amqp() -> &'static str {
    RabbitServer::shared().expect("RabbitMQ broker").url()
}

pub(crate) fn redis() -> &'static RedisServer {
    RedisServer::shared().expect("redis-server")
}

fn amqp_at(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// The settings a test and its workers share.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) queue: String,
    pub(crate) amqp_url: String,
    pub(crate) redis_url: String,
    pub(crate) namespace: String,
    pub(crate) ledger: Ledger,
    /// Whether the consumer declares its queues as quorum queues.
    pub(crate) quorum: bool,
}

impl Setup {
    pub(crate) fn new(name: &str) -> Self {
        Self::new_at(name, amqp(), &redis().url())
    }

    fn new_at(name: &str, amqp_url: &str, redis_url: &str) -> Self {
        let queue = unique(name);
        Self {
            namespace: queue.clone(),
            ledger: Ledger::create(&queue),
            queue,
            amqp_url: amqp_url.to_owned(),
            redis_url: redis_url.to_owned(),
            quorum: false,
        }
    }

    /// The same setup on quorum queues.
    #[allow(dead_code)] // for tests/quorum.rs and tests/chaos_quorum.rs
    pub(crate) fn on_quorum_queues(self) -> Self {
        Self {
            quorum: true,
            ..self
        }
    }

    /// The setup once its topology is declared, so publishing can start
    /// before any worker.
    async fn declared(self) -> Self {
        self.rabbit().await;
        self
    }

    fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_RABBIT_QUEUE", self.queue.clone()),
            ("IDEM_RABBIT_AMQP", self.amqp_url.clone()),
            ("IDEM_RABBIT_REDIS", self.redis_url.clone()),
            ("IDEM_RABBIT_NS", self.namespace.clone()),
            (
                "IDEM_RABBIT_DIR",
                self.ledger.dir().to_string_lossy().into_owned(),
            ),
            ("IDEM_RABBIT_QUORUM", u8::from(self.quorum).to_string()),
        ]
    }

    pub(crate) async fn store(&self) -> RedisStore {
        RedisStore::builder(&self.redis_url)
            .expect("valid URL")
            .namespace(self.namespace.clone())
            .connect()
            .await
            .expect("connect to redis")
    }

    /// The consumer the tests and workers run: short leases so a killed
    /// worker's claims are taken over within seconds, short retry queues.
    pub(crate) async fn rabbit(&self) -> RabbitConsumer<RedisStore, idem::Json> {
        self.rabbit_at(&self.amqp_url).await
    }

    /// [`rabbit`](Self::rabbit) on the broker at `url` (one of the test's
    /// own, or a fault proxy in front of one).
    pub(crate) async fn rabbit_at(&self, url: &str) -> RabbitConsumer<RedisStore, idem::Json> {
        self.rabbit_with(
            url,
            idem_testkit::consumers::scenario::executor(self.store().await),
        )
        .await
    }

    /// [`rabbit_at`](Self::rabbit_at) with the executor `idem`.
    pub(crate) async fn rabbit_with(
        &self,
        url: &str,
        idem: idem::Idempotency<RedisStore>,
    ) -> RabbitConsumer<RedisStore, idem::Json> {
        let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope")).build();
        let builder = RabbitConsumer::builder(url, &self.queue, consumer)
            .prefetch(8)
            .retry_delays([Duration::from_millis(200), Duration::from_secs(1)])
            .message_ttl(Duration::from_secs(3600));
        let builder = match self.quorum {
            true => builder.quorum(),
            false => builder,
        };
        builder.connect().await.expect("connect to RabbitMQ")
    }
}

impl BrokerUnderTest for Setup {
    async fn create(name: &str) -> Self {
        Self::new(name).declared().await
    }

    fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok();
        Some(Self {
            queue: var("IDEM_RABBIT_QUEUE")?,
            amqp_url: var("IDEM_RABBIT_AMQP")?,
            redis_url: var("IDEM_RABBIT_REDIS")?,
            namespace: var("IDEM_RABBIT_NS")?,
            ledger: Ledger::at(PathBuf::from(var("IDEM_RABBIT_DIR")?)),
            quorum: var("IDEM_RABBIT_QUORUM").as_deref() == Some("1"),
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        self.to_env()
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    async fn publish(&self, key: Option<&str>, payload: &str) {
        let (_connection, channel) = publisher_at(&self.amqp_url).await;
        publish(&channel, &self.queue, key, payload).await;
    }

    async fn consume(&self, work: Work, shutdown: impl Future<Output = ()> + Send + 'static) {
        let (idem, _dispatcher) = idem_testkit::consumers::scenario::executor_for(
            &work,
            self.store().await,
            &self.ledger,
        );
        self.rabbit_with(&self.amqp_url, idem)
            .await
            .run(work.handler(self.ledger.clone()), shutdown)
            .await
            .expect("consume");
    }

    /// Nothing ready in the queue or its retry queues, and the
    /// dead-letters in (AMQP does not tell unacknowledged deliveries).
    async fn settled(&self, dead_letters: usize) -> bool {
        let rabbit = self.rabbit().await;
        let (_connection, channel) = publisher_at(&self.amqp_url).await;
        let dead_queue = rabbit.dead_letter_queue();
        for _ in 0..150 {
            let mut pending = 0;
            for queue in rabbit.queues().iter().filter(|q| **q != dead_queue) {
                pending += ready_in(&channel, queue).await;
            }
            let dead = ready_in(&channel, &dead_queue).await;
            if pending == 0 && dead >= dead_letters {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    async fn dead_letters(&self) -> Vec<DeadLetterSeen> {
        let (_connection, channel) = publisher_at(&self.amqp_url).await;
        drain(&channel, &format!("{}.dead", self.queue))
            .await
            .iter()
            .map(|(_, h)| DeadLetterSeen {
                key: text(h, KEY_HEADER).map(str::to_owned),
                reason: text(h, REASON_HEADER).expect("reason").to_owned(),
                consumer: text(h, CONSUMER_HEADER).map(str::to_owned),
            })
            .collect()
    }
}

impl ChaosBroker for Setup {
    type Server = RabbitServer;
    type Store = RedisStore;

    fn start_server() -> Result<RabbitServer, ServerError> {
        RabbitServer::start()
    }

    fn port(server: &RabbitServer) -> u16 {
        server.port()
    }

    fn restart(server: &mut RabbitServer) -> Result<(), ServerError> {
        server.restart()
    }

    async fn create_at(name: &str, broker_port: u16, store_url: &str) -> Self {
        Self::new_at(name, &amqp_at(broker_port), store_url)
            .declared()
            .await
    }

    fn through(&self, broker_port: u16, store_url: &str) -> Self {
        Self {
            amqp_url: amqp_at(broker_port),
            redis_url: store_url.to_owned(),
            ..self.clone()
        }
    }

    async fn store(&self) -> RedisStore {
        Setup::store(self).await
    }

    fn output(&self) -> Self {
        Self {
            queue: format!("{}-out", self.queue),
            namespace: format!("{}-out", self.namespace),
            ledger: self.ledger.output(),
            ..self.clone()
        }
    }

    async fn declare(&self) {
        self.rabbit().await;
    }

    /// The queue: messages go to the default exchange, routed by name.
    fn address(&self) -> String {
        self.queue.clone()
    }

    async fn sender(&self) -> Arc<dyn Sender> {
        Arc::new(RabbitSender::new(&self.amqp_url))
    }
}

/// [`Setup`] on quorum queues: the adapter's tests and chaos runs again
/// with the topology declared `x-queue-type: quorum`.
#[derive(Debug, Clone)]
#[allow(dead_code)] // for tests/quorum.rs and tests/chaos_quorum.rs
pub(crate) struct Quorum(pub(crate) Setup);

impl BrokerUnderTest for Quorum {
    async fn create(name: &str) -> Self {
        Self(Setup::new(name).on_quorum_queues().declared().await)
    }

    fn from_env() -> Option<Self> {
        Setup::from_env().map(Self)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        self.0.env()
    }

    fn ledger(&self) -> &Ledger {
        self.0.ledger()
    }

    async fn publish(&self, key: Option<&str>, payload: &str) {
        self.0.publish(key, payload).await;
    }

    async fn consume(&self, work: Work, shutdown: impl Future<Output = ()> + Send + 'static) {
        self.0.consume(work, shutdown).await;
    }

    async fn settled(&self, dead_letters: usize) -> bool {
        self.0.settled(dead_letters).await
    }

    async fn dead_letters(&self) -> Vec<DeadLetterSeen> {
        self.0.dead_letters().await
    }
}

impl ChaosBroker for Quorum {
    type Server = RabbitServer;
    type Store = RedisStore;

    fn start_server() -> Result<RabbitServer, ServerError> {
        Setup::start_server()
    }

    fn port(server: &RabbitServer) -> u16 {
        Setup::port(server)
    }

    fn restart(server: &mut RabbitServer) -> Result<(), ServerError> {
        Setup::restart(server)
    }

    async fn create_at(name: &str, broker_port: u16, store_url: &str) -> Self {
        Self(
            Setup::new_at(name, &amqp_at(broker_port), store_url)
                .on_quorum_queues()
                .declared()
                .await,
        )
    }

    fn through(&self, broker_port: u16, store_url: &str) -> Self {
        Self(self.0.through(broker_port, store_url))
    }

    async fn store(&self) -> RedisStore {
        self.0.store().await
    }

    fn output(&self) -> Self {
        Self(self.0.output())
    }

    async fn declare(&self) {
        ChaosBroker::declare(&self.0).await;
    }

    fn address(&self) -> String {
        self.0.address()
    }

    async fn sender(&self) -> Arc<dyn Sender> {
        self.0.sender().await
    }
}

/// How many messages `queue` holds ready for delivery.
async fn ready_in(channel: &Channel, queue: &str) -> usize {
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare");
    declared.message_count() as usize
}

/// A publishing channel with confirms.
#[allow(dead_code)] // not every test file publishes directly
pub(crate) async fn publisher() -> (Connection, Channel) {
    publisher_at(amqp()).await
}

/// A publishing channel with confirms, on the broker at `url`.
pub(crate) async fn publisher_at(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    (connection, channel)
}

/// Publishes `payload` to `queue`, keyed by the `Idempotency-Key` header
/// when `key` is given, and waits for the broker's confirm.
pub(crate) async fn publish(channel: &Channel, queue: &str, key: Option<&str>, payload: &str) {
    let mut headers = FieldTable::default();
    if let Some(key) = key {
        headers.insert(
            "Idempotency-Key".into(),
            AMQPValue::LongString(LongString::from(key.as_bytes().to_vec())),
        );
    }
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            payload.as_bytes(),
            BasicProperties::default()
                .with_headers(headers)
                .with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(confirm.is_ack(), "broker confirmed the publish");
}

/// Everything in a queue, taken off it: (payload, headers) pairs.
pub(crate) async fn drain(channel: &Channel, queue: &str) -> Vec<(String, FieldTable)> {
    let mut out = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
    {
        let headers = message
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        out.push((
            String::from_utf8_lossy(&message.delivery.data).into_owned(),
            headers,
        ));
    }
    out
}

/// A header's text.
pub(crate) fn text<'a>(headers: &'a FieldTable, name: &str) -> Option<&'a str> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        _ => None,
    }
}
