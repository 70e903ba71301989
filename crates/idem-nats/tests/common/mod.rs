//! What the JetStream tests share: the server, a redis-server for the
//! store, and worker processes to kill.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::{self, stream, Context};
use async_nats::HeaderMap;
use idem::outbox::Sender;
use idem::Scope;
use idem_consumer::Consumer;
use idem_nats::{JetStreamSender, NatsConsumer, CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
use idem_redis::RedisStore;
use idem_testkit::consumers::ledger::{Ledger, Work};
use idem_testkit::consumers::under_test::{BrokerUnderTest, ChaosBroker, DeadLetterSeen};
use idem_testkit::servers::nats::NatsServer;
use idem_testkit::servers::redis::RedisServer;
use idem_testkit::ServerError;

pub(crate) fn nats_url() -> String {
    NatsServer::shared().expect("nats-server").url()
}

pub(crate) fn redis() -> &'static RedisServer {
    RedisServer::shared().expect("redis-server")
}

/// The settings a test and its workers share.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) stream: String,
    pub(crate) nats_url: String,
    pub(crate) redis_url: String,
    pub(crate) ledger: Ledger,
}

impl Setup {
    pub(crate) fn new(name: &str) -> Self {
        Self::new_at(name, nats_url(), redis().url())
    }

    fn new_at(name: &str, nats_url: String, redis_url: String) -> Self {
        let stream = format!("{name}_{:016x}", rand::random::<u64>());
        Self {
            ledger: Ledger::create(&stream),
            stream,
            nats_url,
            redis_url,
        }
    }

    pub(crate) fn subject(&self) -> String {
        format!("{}.orders", self.stream)
    }

    /// The stream, with a one-hour `max_age`.
    pub(crate) async fn create_stream(&self) -> Context {
        let js = jetstream::new(
            async_nats::connect(self.nats_url.as_str())
                .await
                .expect("connect"),
        );
        js.create_stream(stream::Config {
            name: self.stream.clone(),
            subjects: vec![format!("{}.>", self.stream)],
            max_age: Duration::from_secs(3600),
            duplicate_window: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .expect("create stream");
        js
    }

    pub(crate) async fn store(&self) -> RedisStore {
        RedisStore::builder(&self.redis_url)
            .expect("valid URL")
            .namespace(self.stream.clone())
            .connect()
            .await
            .expect("connect to redis")
    }

    /// The consumer tests and workers run: short leases, so a killed
    /// worker's claims are taken over within seconds, and an `ack_wait`
    /// three heartbeats long.
    pub(crate) async fn nats(&self) -> NatsConsumer<RedisStore, idem::Json> {
        self.nats_with(idem_testkit::consumers::scenario::executor(
            self.store().await,
        ))
        .await
    }

    /// [`nats`](Self::nats) with the executor `idem`.
    pub(crate) async fn nats_with(
        &self,
        idem: idem::Idempotency<RedisStore>,
    ) -> NatsConsumer<RedisStore, idem::Json> {
        let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope")).build();
        NatsConsumer::builder(&self.nats_url, &self.stream, "billing", consumer)
            .concurrency(8)
            .ack_wait(Duration::from_millis(1500))
            .connect()
            .await
            .expect("connect to JetStream")
    }

    async fn js(&self) -> Context {
        jetstream::new(
            async_nats::connect(self.nats_url.as_str())
                .await
                .expect("connect"),
        )
    }
}

impl BrokerUnderTest for Setup {
    async fn create(name: &str) -> Self {
        let setup = Self::new(name);
        setup.create_stream().await;
        // Creates the durable consumer, so nothing published is skipped.
        setup.nats().await;
        setup
    }

    fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok();
        Some(Self {
            stream: var("IDEM_NATS_STREAM")?,
            nats_url: var("IDEM_NATS_URL")?,
            redis_url: var("IDEM_NATS_REDIS")?,
            ledger: Ledger::at(PathBuf::from(var("IDEM_NATS_DIR")?)),
        })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_NATS_STREAM", self.stream.clone()),
            ("IDEM_NATS_URL", self.nats_url.clone()),
            ("IDEM_NATS_REDIS", self.redis_url.clone()),
            (
                "IDEM_NATS_DIR",
                self.ledger.dir().to_string_lossy().into_owned(),
            ),
        ]
    }

    fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    async fn publish(&self, key: Option<&str>, payload: &str) {
        publish(&self.js().await, &self.subject(), key, payload).await;
    }

    async fn consume(&self, work: Work, shutdown: impl Future<Output = ()> + Send + 'static) {
        let (idem, _dispatcher) = idem_testkit::consumers::scenario::executor_for(
            &work,
            self.store().await,
            &self.ledger,
        );
        self.nats_with(idem)
            .await
            .run(work.handler(self.ledger.clone()), shutdown)
            .await
            .expect("consume");
    }

    /// Nothing pending or awaiting an ack on the durable consumer (a
    /// dead-letter copy is stored before its original is terminated).
    async fn settled(&self, _dead_letters: usize) -> bool {
        let js = self.js().await;
        let mut consumer = js
            .get_stream(&self.stream)
            .await
            .expect("stream")
            .get_consumer::<pull::Config>("billing")
            .await
            .expect("consumer");
        for _ in 0..100 {
            let info = consumer.info().await.expect("consumer info");
            if (info.num_pending, info.num_ack_pending) == (0, 0) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    async fn dead_letters(&self) -> Vec<DeadLetterSeen> {
        let text = |h: &HeaderMap, name: &str| h.get(name).map(|v| v.as_str().to_owned());
        read_all(&self.js().await, &format!("{}_DEAD", self.stream))
            .await
            .iter()
            .map(|(_, h)| DeadLetterSeen {
                key: text(h, KEY_HEADER),
                reason: text(h, REASON_HEADER).expect("reason"),
                consumer: text(h, CONSUMER_HEADER),
            })
            .collect()
    }
}

impl ChaosBroker for Setup {
    type Server = NatsServer;
    type Store = RedisStore;

    fn start_server() -> Result<NatsServer, ServerError> {
        NatsServer::start()
    }

    fn port(server: &NatsServer) -> u16 {
        server.port()
    }

    fn restart(server: &mut NatsServer) -> Result<(), ServerError> {
        server.restart()
    }

    async fn create_at(name: &str, broker_port: u16, store_url: &str) -> Self {
        let setup = Self::new_at(
            name,
            format!("nats://127.0.0.1:{broker_port}"),
            store_url.to_owned(),
        );
        setup.create_stream().await;
        setup.nats().await;
        setup
    }

    fn through(&self, broker_port: u16, store_url: &str) -> Self {
        Self {
            nats_url: format!("nats://127.0.0.1:{broker_port}"),
            redis_url: store_url.to_owned(),
            ..self.clone()
        }
    }

    async fn store(&self) -> RedisStore {
        Setup::store(self).await
    }

    fn output(&self) -> Self {
        Self {
            stream: format!("{}_OUT", self.stream),
            ledger: self.ledger.output(),
            ..self.clone()
        }
    }

    async fn declare(&self) {
        self.create_stream().await;
        self.nats().await;
    }

    fn address(&self) -> String {
        self.subject()
    }

    async fn sender(&self) -> Arc<dyn Sender> {
        Arc::new(JetStreamSender::new(self.js().await))
    }
}

/// Publishes `payload`, keyed by `Idempotency-Key` when given, and waits
/// for JetStream to store it.
pub(crate) async fn publish(js: &Context, subject: &str, key: Option<&str>, payload: &str) {
    let mut headers = HeaderMap::new();
    if let Some(key) = key {
        headers.insert("Idempotency-Key", key);
    }
    js.publish_with_headers(subject.to_owned(), headers, payload.to_owned().into())
        .await
        .expect("publish")
        .await
        .expect("stored");
}

/// Every message of a stream, as (payload, headers).
pub(crate) async fn read_all(js: &Context, stream: &str) -> Vec<(String, HeaderMap)> {
    let mut stream = js.get_stream(stream).await.expect("stream");
    let last = stream.info().await.expect("info").state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        if let Ok(raw) = stream.get_raw_message(seq).await {
            out.push((
                String::from_utf8_lossy(&raw.payload).into_owned(),
                raw.headers,
            ));
        }
    }
    out
}
