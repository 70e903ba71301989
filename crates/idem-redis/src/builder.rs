//! [`RedisStoreBuilder`]: defaults, URL parsing and connecting.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::TokenMint;
use redis::Value;

use crate::conn::{url, Conn, Options, ReplicaAcks, Target};
use crate::error::ConnectError;
use crate::group::Scripted;
use crate::horizon::settle_memory;
use crate::notify::Notifier;
use crate::scripts::Scripts;
use crate::store::{Inner, RedisStore};

/// `url` with any password masked, for logs and messages.
pub fn redact_url(url: &str) -> String {
    url::redact(url)
}

/// The default key prefix.
pub const DEFAULT_NAMESPACE: &str = "idem";
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default response timeout: a call that gets no answer in this time
/// fails with [`StoreError::Unavailable`](idem::StoreError::Unavailable).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long Redis keeps a record past its retention deadline before it
/// drops it. The record already reads as absent; it is kept so that its
/// fence is there to build on if the key is claimed again at once.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// How long a write waits for its replicas when
/// [`replica_acks`](RedisStoreBuilder::replica_acks) is on and no timeout
/// is given.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_secs(1);

/// Sets up a [`RedisStore`]: from [`RedisStore::builder`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    target: Target,
    namespace: String,
    options: Options,
    tls_ca_file: Option<String>,
    grace: Duration,
    batching: bool,
    memory: Option<Duration>,
}

impl RedisStoreBuilder {
    /// The key prefix: every key the store writes starts with
    /// `namespace:`. Stores with different namespaces never see each
    /// other's records.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// How long to wait for a connection ([`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect = timeout;
        self
    }

    /// How long to wait for an answer ([`DEFAULT_RESPONSE_TIMEOUT`]).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.options.response = timeout;
        self
    }

    /// How long Redis keeps a record past its retention deadline
    /// ([`DEFAULT_GRACE`]; at least one second).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace.max(Duration::from_secs(1));
        self
    }

    /// Whether claims and holder writes that callers make at the same time
    /// go to a single server together, as one script call (default: yes).
    /// Each stays atomic on its own; a lone call is sent at once. Under
    /// load this is what lets the store keep up with a busy consumer: one
    /// round trip and one script run for many calls instead of one each.
    /// A Cluster spreads records over slots and runs one script per call
    /// either way.
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// Remembers the keys of completed and failed records for `memory`
    /// after their retention ([`idem::horizon`]): a late retry of such a
    /// key is answered `Forgotten` instead of running again. Each record
    /// that ends leaves a small key beside it (`<record key>:h`, about 200
    /// bytes of Redis memory with its key and expiry) that Redis keeps for
    /// `memory` past the day the record's retention ends. Kept in the
    /// namespace (`<namespace>:remember_ms`), so every process on it
    /// remembers alike; zero turns it off. Only the keys of records that
    /// end while it is on are remembered. The URL's `remember=30d` says
    /// the same.
    pub fn remember_expired(mut self, memory: Duration) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Makes every write wait until `replicas` replicas acknowledge it
    /// (Redis `WAIT`), for at most `timeout`, before it counts; the URL's
    /// `replicas=N&replica_timeout=500ms` does the same (default timeout
    /// [`DEFAULT_REPLICA_TIMEOUT`]). `0` replicas turns it off (the
    /// default).
    ///
    /// Redis replicates asynchronously: without this, a failover can
    /// promote a replica that lacks the last writes its master
    /// acknowledged, and a completion idem reported is forgotten (its key
    /// runs again). With `replicas` set to every replica of a shard, a
    /// write idem reports is on each of them. A write short of `replicas`
    /// in `timeout` fails as [`StoreError::Unavailable`](idem::StoreError::Unavailable): it is on the
    /// master and may yet be lost, and the executor treats it as a lost
    /// answer. `timeout` must be shorter than the response timeout. Each
    /// call costs the replicas' round trip on top of the master's.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.options.replica_acks = (replicas > 0).then_some(ReplicaAcks { replicas, timeout });
        self
    }

    /// Trusts these root certificates (PEM) for TLS instead of the
    /// platform's: for servers with a private CA. The URL's
    /// `tls_ca_file=PATH` does the same.
    pub fn tls_roots(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.options.tls_roots = Some(pem.into());
        self.tls_ca_file = None;
        self
    }

    /// Connects, and fails if the server cannot be reached.
    pub async fn connect(mut self) -> Result<RedisStore, ConnectError> {
        let valid = (1..=64).contains(&self.namespace.len())
            && self
                .namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b));
        if !valid {
            return Err(ConnectError::InvalidNamespace(self.namespace));
        }
        if let Some(acks) = self.options.replica_acks {
            if acks.timeout.is_zero() || acks.timeout >= self.options.response {
                return Err(ConnectError::InvalidSetting(format!(
                    "the replica timeout ({:?}) must be above zero and below the response \
                     timeout ({:?}), or every write would time out before its replicas answer",
                    acks.timeout, self.options.response
                )));
            }
        }
        if let Some(path) = self.tls_ca_file.take() {
            let pem = std::fs::read(&path).map_err(|e| ConnectError::InvalidUrl {
                url: url::redact(&self.url),
                reason: format!("cannot read tls_ca_file {path}: {e}"),
            })?;
            self.options.tls_roots = Some(pem);
        }
        let conn = Conn::open(&self.target, &self.options)
            .await
            .map_err(|source| ConnectError::Unavailable {
                url: url::redact(&self.url),
                source,
            })?;
        let notify_at = match &self.target {
            Target::Standalone(url) => url.clone(),
            Target::Cluster { nodes, .. } => nodes.first().cloned().unwrap_or_default(),
        };
        let (memory, memory_ms) = settle_memory(&conn, &self.namespace, self.memory)
            .await
            .map_err(|source| ConnectError::Unavailable {
                url: url::redact(&self.url),
                source,
            })?;
        let notifier = Notifier::new(notify_at, self.options.clone());
        let scripts = Arc::new(Scripts::new());
        let batcher = match &conn {
            Conn::Standalone(server) => {
                warn_if_evicting(&conn).await;
                self.batching
                    .then(|| Scripted::group(server.clone(), Arc::clone(&scripts)))
            }
            Conn::Cluster(_) => None,
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                namespace: self.namespace,
                grace_ms: Bytes::from(self.grace.as_millis().to_string()),
                memory,
                memory_ms,
                tokens: TokenMint::new(),
                scripts,
                batcher,
                notifier,
            }),
        })
    }
}

impl RedisStore {
    /// Connects to `url` with the defaults (see the [crate docs](crate)
    /// for the URL forms).
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::builder(url)?.connect().await
    }

    /// A builder for `url`, to set more than the URL says.
    pub fn builder(url: &str) -> Result<RedisStoreBuilder, ConnectError> {
        let parsed = url::parse_url(url)?;
        Ok(RedisStoreBuilder {
            url: url.to_owned(),
            target: parsed.target,
            namespace: parsed
                .namespace
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
            options: Options {
                connect: parsed.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
                response: parsed.response_timeout.unwrap_or(DEFAULT_RESPONSE_TIMEOUT),
                tls_roots: None,
                replica_acks: parsed
                    .replicas
                    .filter(|n| *n > 0)
                    .map(|replicas| ReplicaAcks {
                        replicas,
                        timeout: parsed.replica_timeout.unwrap_or(DEFAULT_REPLICA_TIMEOUT),
                    }),
            },
            tls_ca_file: parsed.tls_ca_file,
            grace: DEFAULT_GRACE,
            batching: true,
            memory: parsed.remember,
        })
    }
}

/// Logs a warning when the server may evict keys that have an expiry
/// (idem's records): an evicted record is a forgotten claim.
async fn warn_if_evicting(conn: &Conn) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let Ok(reply) = conn.query(&cmd).await else {
        return;
    };
    let policy = match reply {
        Value::Array(items) => items.into_iter().nth(1),
        Value::Map(pairs) => pairs.into_iter().next().map(|(_, v)| v),
        _ => None,
    };
    if let Some(Value::BulkString(policy)) = policy {
        let policy = String::from_utf8_lossy(&policy);
        if policy != "noeviction" {
            tracing::warn!(
                %policy,
                "Redis may evict idem's records under memory pressure, forgetting claims and \
                 outcomes; set maxmemory-policy noeviction"
            );
        }
    }
}
