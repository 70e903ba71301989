//! What the RabbitMQ tests share: the broker, a redis-server for the
//! store, an effects ledger on disk, and worker processes to kill.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idem::{Idempotency, Scope, Terminal};
use idem_consumer::Consumer;
use idem_rabbitmq::RabbitConsumer;
use idem_redis::RedisStore;
use idem_testkit::rabbitmq::RabbitServer;
use idem_testkit::redis::RedisServer;
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

pub(crate) fn amqp() -> &'static str {
    RabbitServer::shared().expect("RabbitMQ broker").url()
}

pub(crate) fn redis() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start().expect("start redis-server"))
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// The settings a test and its workers share.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) queue: String,
    pub(crate) redis_url: String,
    pub(crate) namespace: String,
    pub(crate) dir: PathBuf,
}

impl Setup {
    pub(crate) fn new(name: &str) -> Self {
        let queue = unique(name);
        let dir = std::env::temp_dir().join(format!("idem-rabbitmq-test-{queue}"));
        std::fs::create_dir_all(&dir).expect("ledger directory");
        Self {
            namespace: queue.clone(),
            queue,
            redis_url: redis().url(),
            dir,
        }
    }

    fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_RABBIT_QUEUE", self.queue.clone()),
            ("IDEM_RABBIT_REDIS", self.redis_url.clone()),
            ("IDEM_RABBIT_NS", self.namespace.clone()),
            ("IDEM_RABBIT_DIR", self.dir.to_string_lossy().into_owned()),
            ("IDEM_TEST_AMQP_URL", amqp().to_owned()),
        ]
    }

    pub(crate) fn from_env() -> Option<Self> {
        let var = |name| std::env::var(name).ok();
        Some(Self {
            queue: var("IDEM_RABBIT_QUEUE")?,
            redis_url: var("IDEM_RABBIT_REDIS")?,
            namespace: var("IDEM_RABBIT_NS")?,
            dir: PathBuf::from(var("IDEM_RABBIT_DIR")?),
        })
    }

    pub(crate) fn ledger(&self) -> PathBuf {
        self.dir.join("effects")
    }

    pub(crate) fn started(&self) -> PathBuf {
        self.dir.join("started")
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
        let idem = Idempotency::builder(self.store().await)
            .lease(Duration::from_secs(2))
            .heartbeat(Duration::from_millis(500))
            .max_attempts(std::num::NonZeroU32::new(3).expect("non-zero"))
            .backoff(idem::Backoff::new(
                Duration::from_millis(100),
                Duration::from_millis(500),
            ))
            .build()
            .expect("config");
        let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope")).build();
        RabbitConsumer::builder(amqp(), &self.queue, consumer)
            .prefetch(8)
            .retry_delays([Duration::from_millis(200), Duration::from_secs(1)])
            .message_ttl(Duration::from_secs(3600))
            .connect()
            .await
            .expect("connect to RabbitMQ")
    }

    /// Starts this test binary as a worker process running [`work`].
    pub(crate) fn spawn_worker(&self, slow_key: Option<&str>) -> Child {
        let mut command = Command::new(std::env::current_exe().expect("test binary"));
        command
            .args(["--exact", "worker_process", "--ignored", "--nocapture"])
            .envs(self.to_env())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(key) = slow_key {
            command.env("IDEM_RABBIT_SLOW", key);
        }
        command.spawn().expect("spawn worker")
    }
}

/// The error the test handler returns: terminal for poison, retryable
/// otherwise.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandlerError {
    #[error("poison: {0}")]
    Poison(#[from] Terminal),
    #[error("flaky downstream on attempt {0}")]
    Flaky(u32),
    #[error("lease lost before the effect")]
    LeaseLost(#[from] idem::LeaseLost),
}

/// The handler every test uses. Payload: `{"id": .., "poison": bool,
/// "flaky": bool}`. It notes the start in `started`, sleeps forever on
/// `slow` (to be killed there), fails terminally on poison and retryably
/// on the first attempt of a flaky message, and otherwise appends exactly
/// one line, the key, to the effects ledger.
pub(crate) async fn handle(
    job: idem_consumer::Job<idem_rabbitmq::AmqpMessage>,
    setup: Setup,
    slow: Option<String>,
) -> Result<(), HandlerError> {
    let body: serde_json::Value = job.json()?;
    let key = job.key().as_str().to_owned();
    append(&setup.started(), &key);
    if slow.as_deref() == Some(key.as_str()) {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    if body["poison"] == true {
        return Err(Terminal::new("cannot ship to the moon").into());
    }
    if body["flaky"] == true && job.ctx().attempt() == 1 {
        return Err(HandlerError::Flaky(1));
    }
    job.ctx().ensure_lease()?;
    append(&setup.ledger(), &key);
    Ok(())
}

/// One line appended with one `write` on an `O_APPEND` file, so lines from
/// several processes never interleave.
pub(crate) fn append(path: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open ledger");
    file.write_all(format!("{line}\n").as_bytes())
        .expect("append to ledger");
}

/// Lines of a ledger, counted.
pub(crate) fn counts(path: &Path) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

/// Polls `check` every 50 ms until it holds or `limit` passes.
pub(crate) async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

/// A publishing channel with confirms.
pub(crate) async fn publisher() -> (Connection, Channel) {
    let connection = Connection::connect(amqp(), ConnectionProperties::default())
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
