//! What the JetStream tests share: the server, a redis-server for the
//! store, and worker processes to kill.

use std::path::PathBuf;
use std::process::Child;
use std::sync::OnceLock;
use std::time::Duration;

use async_nats::jetstream::{self, stream, Context};
use async_nats::HeaderMap;
use idem::Scope;
use idem_consumer::Consumer;
use idem_nats::NatsConsumer;
use idem_redis::RedisStore;
use idem_testkit::ledger::Ledger;
use idem_testkit::nats::NatsServer;
use idem_testkit::redis::RedisServer;

pub(crate) fn nats_url() -> String {
    NatsServer::shared().expect("nats-server").url()
}

pub(crate) fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start().expect("start redis-server"))
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
        let stream = format!("{name}_{:016x}", rand::random::<u64>());
        Self {
            ledger: Ledger::create(&stream),
            stream,
            nats_url: nats_url(),
            redis_url: redis().url(),
        }
    }

    pub(crate) fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok();
        Some(Self {
            stream: var("IDEM_NATS_STREAM")?,
            nats_url: var("IDEM_NATS_URL")?,
            redis_url: var("IDEM_NATS_REDIS")?,
            ledger: Ledger::at(PathBuf::from(var("IDEM_NATS_DIR")?)),
        })
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
        let idem = idem_testkit::scenario::executor(self.store().await);
        let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope")).build();
        NatsConsumer::builder(&self.nats_url, &self.stream, "billing", consumer)
            .concurrency(8)
            .ack_wait(Duration::from_millis(1500))
            .connect()
            .await
            .expect("connect to JetStream")
    }

    /// Starts this test binary as a worker process (`worker_process`).
    pub(crate) fn spawn_worker(&self, slow_key: Option<&str>) -> Child {
        let dir = self.ledger.dir().to_string_lossy().into_owned();
        idem_testkit::scenario::spawn_worker(
            [
                ("IDEM_NATS_STREAM", self.stream.as_str()),
                ("IDEM_NATS_URL", self.nats_url.as_str()),
                ("IDEM_NATS_REDIS", self.redis_url.as_str()),
                ("IDEM_NATS_DIR", dir.as_str()),
            ],
            slow_key,
        )
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
