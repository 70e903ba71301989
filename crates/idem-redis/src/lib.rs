//! # idem-redis: the Redis store
//!
//! Keeps idem's records in Redis — one server or a Redis Cluster — with
//! every transition of the [store contract](idem::contract) done by one Lua
//! script on the server:
//!
//! - **Atomic and fenced.** `claim`, `complete`, `fail`, `extend` and
//!   `release` are each one Lua function run on the server (`lua/*.lua` in
//!   this crate). Writes check the holder's token inside the script, so a
//!   worker whose lease ran out can never overwrite the new holder's
//!   record, and nothing is read by the client and then written back.
//! - **Batched under load.** On a single server, calls made at the same
//!   time go together as one call of the batch script (group commit): the
//!   first call goes at once, those that arrive while it is out share the
//!   next. Each is still atomic and answered on its own; an error in one
//!   fails that call alone. A busy consumer pays one round trip and one
//!   script run for many messages instead of two each.
//!   [`RedisStoreBuilder::batching`] turns it off.
//! - **Compact records.** A record is one string: its fields and its
//!   response packed together, written with its expiry in one `SET`, so a
//!   claim makes two calls inside the script (a read and a write), and so
//!   does a completion. The step journal is a hash beside it, only for
//!   runs that journal steps. A record that cannot be read is reported as
//!   [`StoreError::Corrupt`] and left as it is. Records that builds before
//!   2026-11-26 kept as hashes are read as they are and turned into
//!   strings by their next write, so an upgrade needs no draining.
//! - **The server's clock.** Scripts read Redis `TIME`; no decision
//!   depends on client clocks agreeing.
//! - **Expiry at read time.** A record past its retention deadline is
//!   absent to every script whether or not Redis has dropped it yet. Redis
//!   drops it by itself a grace period later ([`DEFAULT_GRACE`]), so
//!   memory is reclaimed without a sweeper.
//! - **Cluster-ready.** A record's key (and its journal's) carries its own
//!   hash tag, so each script touches one slot and the same scripts run
//!   unchanged on a Cluster. No key is shared by all records: tokens are
//!   made by the client (a random per-store instance id and a counter) and
//!   fences rise per key from the record itself, or from the server clock
//!   in microseconds once the record is gone.
//! - **Waiters are woken, not polling.** A duplicate that waits for an
//!   in-flight run (`wait_for_in_flight`, HTTP `Prefer: wait`) subscribes
//!   to its record's channel (`<record key>:done`, carrying the hash tag,
//!   so it works on a Cluster too) and marks the record; the scripts that
//!   end a claim publish there when the record is marked, and only then.
//!   One pub/sub connection per store, opened on first wait; a read each
//!   second stays underneath as a safety net, and without pub/sub the wait
//!   polls.
//! - **Fails fast.** Connect and response timeouts are bounded, so a dead
//!   server is a [`StoreError::Unavailable`] within about a second, and the
//!   connection recovers on its own when the server returns.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, RecordId};
//! use idem_redis::RedisStore;
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379/?namespace=payments").await?;
//! // or: RedisStore::connect("redis+cluster://127.0.0.1:7000,127.0.0.1:7001").await?
//! let idem = Idempotency::builder(store).build()?;
//! let id = RecordId::parse("charges", "order-42")?;
//! let charge = idem
//!     .run(&id, None, |_| async { Ok::<_, std::io::Error>("ch_1".to_owned()) })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! ## URLs
//!
//! | URL | meaning |
//! |---|---|
//! | `redis://[user:password@]host:port[/db]` | one server (ACL user, database number) |
//! | `rediss://…` | the same over TLS (the `tls` feature) |
//! | `redis+cluster://[user:password@]host:port,host:port,…` | a Cluster, from any seed nodes |
//! | `rediss+cluster://…` | a Cluster over TLS |
//!
//! Query parameters: `namespace` (the key prefix, default `idem`),
//! `connect_timeout` and `response_timeout` (`500ms`, `2s`), `replicas`
//! and `replica_timeout` (writes wait for replicas:
//! [`RedisStoreBuilder::replica_acks`]), and for TLS
//! `tls_ca_file` (a PEM file of roots to trust instead of the platform's);
//! others (such as `protocol=resp3`) go to the `redis` crate.
//!
#![doc = include_str!("../docs/persistence.md")]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::{
    journal_of, ClaimOutcome, ClaimParams, DeleteRecord, DynStepJournal, Failure, FindAbandoned,
    GetRecord, Lease, LeaseToken, ListPage, ListQuery, ListRecords, PurgeExpired, Record, RecordId,
    Resolution, Resolved, Scope, State, StepBegin, StepEntry, StepJournal, Store, StoreError,
    Timestamp, TokenMint,
};
use redis::Value;
use sha2::{Digest, Sha256};

mod batch;
mod cache;
mod call;
mod conn;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod many;
mod notify;
mod record;
mod replicas;
mod scripts;
mod slots;
mod url;

use batch::{Batcher, Scripted};
use call::{Call, Op};
use conn::{store_error, Conn, Options};
use notify::Notifier;
use replicas::ReplicaAcks;
use scripts::Scripts;
use url::Target;

pub use cache::RedisReplayCache;

/// `url` with any password masked, for logs and messages.
pub fn redact_url(url: &str) -> String {
    url::redact(url)
}

/// The default key prefix.
pub const DEFAULT_NAMESPACE: &str = "idem";
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default response timeout: a call that gets no answer in this time
/// fails with [`StoreError::Unavailable`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long Redis keeps a record past its retention deadline before it
/// drops it. The record already reads as absent; it is kept so that its
/// fence is there to build on if the key is claimed again at once.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// How long a write waits for its replicas when
/// [`replica_acks`](RedisStoreBuilder::replica_acks) is on and no timeout
/// is given.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be used. The message never contains the password.
    #[error("invalid Redis URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting cannot be used; the message says which and why.
    #[error("invalid Redis store setting: {0}")]
    InvalidSetting(String),
    /// The namespace is not 1 to 64 characters of `A-Z a-z 0-9 _ . : -`.
    #[error("invalid namespace {0:?}: use 1 to 64 characters of A-Z a-z 0-9 _ . : -")]
    InvalidNamespace(String),
    /// The server (or no Cluster node) answered.
    #[error("could not connect to Redis at {url}")]
    Unavailable {
        /// The URL, password masked.
        url: String,
        /// What the client reported.
        #[source]
        source: redis::RedisError,
    },
}

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
    /// in `timeout` fails as [`StoreError::Unavailable`]: it is on the
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
                tokens: TokenMint::new(),
                scripts,
                batcher,
                notifier,
            }),
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

/// The Redis store. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Conn,
    namespace: String,
    grace_ms: Bytes,
    tokens: TokenMint,
    scripts: Arc<Scripts>,
    /// Sends the primitives in batches (a single server, unless turned
    /// off).
    batcher: Option<Arc<Batcher>>,
    /// Wakes callers waiting for a record's outcome.
    notifier: Notifier,
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
        })
    }

    /// Whether this store talks to a Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// The key prefix.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The SHA-1 of the claim script, as `EVALSHA` takes it (for
    /// `redis-benchmark`). Its arguments are listed in `lua/claim.lua`.
    pub fn claim_script_sha(&self) -> &str {
        self.inner.scripts.claim_sha()
    }

    /// The Redis key holding `id`'s record:
    /// `namespace:<scope hash>:{<id hash>}`. The braces make the id hash
    /// the record's Cluster hash tag; the scope hash lets a list by scope
    /// scan only that scope's keys.
    pub fn record_key(&self, id: &RecordId) -> String {
        let scope = Sha256::digest(id.scope().as_str().as_bytes());
        let mut whole = Sha256::new();
        whole.update(id.scope().as_str().as_bytes());
        whole.update([0]);
        whole.update(id.key().as_str().as_bytes());
        format!(
            "{}:{}:{{{}}}",
            self.inner.namespace,
            hex::encode(&scope[..8]),
            hex::encode(&whole.finalize()[..16])
        )
    }

    fn scope_pattern(&self, scope: Option<&Scope>) -> String {
        match scope {
            Some(scope) => {
                let hash = Sha256::digest(scope.as_str().as_bytes());
                format!("{}:{}:*}}", self.inner.namespace, hex::encode(&hash[..8]))
            }
            None => format!("{}:*}}", self.inner.namespace),
        }
    }

    fn fresh_token(&self) -> LeaseToken {
        self.inner.tokens.next()
    }

    async fn claim_one(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let token = self.fresh_token();
        let reply = self
            .primitive(self.claim_call(id, token, params))
            .await
            .map_err(|e| damaged(id, e))?;
        record::claim_outcome(id, token, reply)
    }

    /// The claim of `id` with `token`, as the claim script takes it.
    fn claim_call(&self, id: &RecordId, token: LeaseToken, params: &ClaimParams) -> Call {
        let text = |s: String| Bytes::from(s);
        Call {
            op: Op::Claim,
            key: self.record_key(id),
            args: vec![
                text(token.to_hex()),
                text(params.fingerprint.map(|f| f.to_hex()).unwrap_or_default()),
                millis(params.lease),
                millis(params.retention),
                Bytes::copy_from_slice(id.scope().as_str().as_bytes()),
                Bytes::copy_from_slice(id.key().as_str().as_bytes()),
                self.inner.grace_ms.clone(),
            ],
        }
    }

    /// Runs one primitive: in the next batch on a single server, or as a
    /// script call of its own (a Cluster, or batching turned off).
    async fn primitive(&self, call: Call) -> Result<Value, StoreError> {
        if let Some(batcher) = &self.inner.batcher {
            return batcher.call(call).await;
        }
        self.inner
            .scripts
            .primitive(call.op)
            .run(&self.inner.conn, &call.key, &call.arg_slices())
            .await
            .map_err(store_error)
    }

    /// Runs a holder's write; `Ok(reply)` when the token held.
    async fn write(&self, op: Op, lease: &Lease, args: Vec<Bytes>) -> Result<Value, StoreError> {
        self.primitive(self.holder_call(op, lease, args))
            .await
            .map_err(|e| damaged(&lease.id, e))
    }

    /// A holder's write as its script takes it: the token, then `args`.
    fn holder_call(&self, op: Op, lease: &Lease, args: Vec<Bytes>) -> Call {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(Bytes::from(lease.token.to_hex()));
        all.extend(args);
        Call {
            op,
            key: self.record_key(&lease.id),
            args: all,
        }
    }

    /// The completion's arguments after the token.
    fn completion_args(&self, response: Bytes, retention: Duration) -> Vec<Bytes> {
        vec![response, millis(retention), self.inner.grace_ms.clone()]
    }

    /// Runs a step-journal script, whose first argument is the holder's
    /// token.
    async fn journal_write(
        &self,
        script: &scripts::Script,
        lease: &Lease,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let key = self.record_key(&lease.id);
        let token = lease.token.to_hex();
        let mut all: Vec<&[u8]> = Vec::with_capacity(args.len() + 1);
        all.push(token.as_bytes());
        all.extend_from_slice(args);
        script
            .run(&self.inner.conn, &key, &all)
            .await
            .map_err(|e| damaged(&lease.id, store_error(e)))
    }

    /// Every key of this namespace (and scope, if given), one scan page at
    /// a time, over every master of a Cluster.
    async fn scan(&self, scope: Option<&Scope>) -> Result<Scan, StoreError> {
        Ok(Scan {
            pattern: self.scope_pattern(scope),
            nodes: self.servers().await?,
            cursor: 0,
        })
    }

    /// The servers holding records: the Cluster's masters from `CLUSTER
    /// SLOTS`, or `None` for the one server of a standalone store (as
    /// [`Conn::query_node`] takes them).
    async fn servers(&self) -> Result<Vec<Option<(String, u16)>>, StoreError> {
        if let Conn::Standalone(_) = self.inner.conn {
            return Ok(vec![None]);
        }
        let reply = self
            .inner
            .conn
            .query(redis::cmd("CLUSTER").arg("SLOTS"))
            .await
            .map_err(store_error)?;
        let ranges = slots::parse(&reply).ok_or_else(|| {
            StoreError::Backend(format!("unexpected CLUSTER SLOTS reply {reply:?}").into())
        })?;
        let mut masters = Vec::new();
        for (_, _, addr) in ranges {
            if !masters.contains(&Some(addr.clone())) {
                masters.push(Some(addr));
            }
        }
        Ok(masters)
    }

    /// Runs `script` on each key and returns the replies in order. On a
    /// single server the calls go out as one pipeline. On a Cluster they
    /// are grouped by slot: the groups go out all at once (so each node's
    /// connection pipelines them), and the calls of one group one after
    /// another, each routed on its own so that ASK and MOVED answers are
    /// followed. Calls on the same key share a slot, so they run in the
    /// order given, as single calls would. Errors come as the server gave
    /// them: the caller knows what to name a damaged record by.
    async fn run_each(
        &self,
        script: &scripts::Script,
        calls: &[(String, Vec<Vec<u8>>)],
    ) -> Vec<Result<Value, StoreError>> {
        let Conn::Standalone(server) = &self.inner.conn else {
            let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
            for (i, (key, _)) in calls.iter().enumerate() {
                by_slot
                    .entry(slots::slot(key.as_bytes()))
                    .or_default()
                    .push(i);
            }
            let groups = by_slot.into_values().map(|group| async move {
                let mut out = Vec::with_capacity(group.len());
                for i in group {
                    let (key, args) = &calls[i];
                    let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    let result = script.run(&self.inner.conn, key, &args).await;
                    out.push((i, result.map_err(store_error)));
                }
                out
            });
            let mut done: Vec<_> = futures_util::future::join_all(groups)
                .await
                .into_iter()
                .flatten()
                .collect();
            done.sort_unstable_by_key(|(i, _)| *i);
            return done.into_iter().map(|(_, result)| result).collect();
        };
        self.pipeline(server, script, calls).await
    }

    /// All `calls` as one pipeline to a single server. A call the server
    /// refused without running it (the script not loaded there, after a
    /// restart) runs again on its own, in order.
    async fn pipeline(
        &self,
        server: &conn::Server,
        script: &scripts::Script,
        calls: &[(String, Vec<Vec<u8>>)],
    ) -> Vec<Result<Value, StoreError>> {
        let mut pipe = redis::pipe();
        for (key, args) in calls {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            pipe.add_command(script.evalsha(key, &args));
        }
        pipe.ignore_errors();
        let replies = server.query_pipe(pipe).await;
        let replies = match replies {
            Ok(replies) if replies.len() == calls.len() => replies,
            Ok(replies) => {
                let reason = format!("a pipeline of {} answered {}", calls.len(), replies.len());
                return calls
                    .iter()
                    .map(|_| Err(StoreError::Backend(reason.clone().into())))
                    .collect();
            }
            Err(e) => {
                let e = store_error(e);
                return calls.iter().map(|_| Err(e.copy())).collect();
            }
        };
        let mut out = Vec::with_capacity(calls.len());
        for ((key, args), reply) in calls.iter().zip(replies) {
            out.push(match reply {
                Err(e) if scripts::is_noscript(&e) => {
                    let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    script
                        .run(&self.inner.conn, key, &args)
                        .await
                        .map_err(store_error)
                }
                other => other.map_err(store_error),
            });
        }
        out
    }

    /// Loads every script on the servers this store reaches now (a Cluster:
    /// every master). Optional: a server that lacks a script gets it on
    /// first use.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let batch = self.inner.batcher.as_ref().map(|b| b.get_ref().script());
        for node in self.servers().await? {
            for script in self.inner.scripts.all().into_iter().chain(batch) {
                self.inner
                    .conn
                    .query_node(script.load(), node.clone())
                    .await
                    .map_err(store_error)?;
            }
        }
        Ok(())
    }
}

/// A scan over the masters, one page at a time.
struct Scan {
    pattern: String,
    /// The nodes left to scan, the current one first (`None`: the one
    /// server of a standalone store).
    nodes: Vec<Option<(String, u16)>>,
    cursor: u64,
}

impl Scan {
    /// The next page of keys, or `None` when every node is done.
    async fn next(&mut self, conn: &Conn) -> Result<Option<Vec<String>>, StoreError> {
        let Some(node) = self.nodes.first().cloned() else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = conn.query_node(cmd, node).await.map_err(store_error)?;
        let (cursor, keys): (u64, Vec<String>) = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Backend(format!("unexpected SCAN reply: {e}").into()))?;
        self.cursor = cursor;
        if cursor == 0 {
            self.nodes.remove(0);
        }
        Ok(Some(keys))
    }
}

/// Redis keeps no index of leases (a Cluster could not update one
/// atomically with the record), so a call scans the scope's keys and asks
/// each record's server whether it is abandoned, by the server's clock: a
/// sweep costs one scan page per 1000 keys and one script call per key of
/// the scope, and ends early once `limit` are found.
impl FindAbandoned for RedisStore {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let mut scan = self.scan(Some(scope)).await?;
        let mut found: Vec<(RecordId, Record)> = Vec::new();
        while found.len() < limit {
            let Some(keys) = scan.next(&self.inner.conn).await? else {
                break;
            };
            let calls: Vec<(String, Vec<Vec<u8>>)> = keys
                .into_iter()
                .map(|k| (k, vec![b"abandoned".to_vec()]))
                .collect();
            let replies = self.run_each(&self.inner.scripts.get, &calls).await;
            for ((key, _), reply) in calls.iter().zip(replies) {
                let reply = reply.map_err(|e| damaged(key, e))?;
                if let Some((id, record)) = record::record(None, reply)? {
                    if id.scope() == scope {
                        found.push((id, record));
                    }
                }
            }
        }
        found.sort_by_key(|(_, r)| match r.state {
            State::InProgress { lease_until, .. } => Some(lease_until),
            _ => None,
        });
        found.truncate(limit);
        Ok(found)
    }
}

impl Store for RedisStore {
    async fn peek(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        GetRecord::get(self, id).await
    }

    fn step_journal(&self) -> Option<Arc<dyn DynStepJournal>> {
        Some(journal_of(self.clone()))
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        self.claim_one(id, params).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let args = self.completion_args(response, retention);
        let reply = self.write(Op::Complete, lease, args).await?;
        written(&lease.id, reply)
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let args = vec![
            Bytes::from_static(failure.class.as_str().as_bytes()),
            Bytes::from(failure.message),
            millis(retention),
            self.inner.grace_ms.clone(),
        ];
        let reply = self.write(Op::Fail, lease, args).await?;
        written(&lease.id, reply)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        let args = vec![millis(duration), self.inner.grace_ms.clone()];
        let reply = self.write(Op::Extend, lease, args).await?;
        match reply {
            Value::Int(n) if n < 0 => Err(StoreError::LeaseLost),
            Value::Int(n) => Ok(Timestamp::from_millis(n.unsigned_abs())),
            other => Err(StoreError::Corrupt {
                id: lease.id.to_string(),
                reason: format!("extend replied {other:?}"),
            }),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let reply = self.write(Op::Release, lease, Vec::new()).await?;
        written(&lease.id, reply)
    }

    /// Waits for the record's end to be published (see the crate docs) or
    /// `timeout`; returns at once if the record is not in progress. The
    /// caller claims again either way; the claim decides.
    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        let key = self.record_key(id);
        let channel = notify::channel(&key);
        self.inner
            .notifier
            .wait(channel, timeout, || async {
                // Marks the record so that its end publishes (`lua/watch.lua`).
                let watched = self
                    .inner
                    .scripts
                    .watch
                    .run(&self.inner.conn, &key, &[])
                    .await;
                matches!(watched, Ok(Value::Int(1)))
            })
            .await;
    }
}

/// A script's refusal of a record it cannot read (an error starting
/// `DAMAGED`, see `lua/prelude.lua`) as [`StoreError::Corrupt`] naming
/// `id`; any other error as it is. The record is left untouched.
fn damaged(id: &(impl std::fmt::Display + ?Sized), error: StoreError) -> StoreError {
    const MARK: &str = "DAMAGED";
    let StoreError::Backend(source) = &error else {
        return error;
    };
    let text = source.to_string();
    match text.find(MARK) {
        Some(at) => StoreError::Corrupt {
            id: id.to_string(),
            reason: text[at + MARK.len()..]
                .trim_start_matches([':', ' '])
                .to_owned(),
        },
        None => error,
    }
}

/// A duration in milliseconds, as the scripts take it: at most
/// [`idem::LONGEST_HELD`], since a later time overflows the scripts'
/// integer formatting and `PEXPIREAT` (a negative time deletes the key).
fn millis(d: Duration) -> Bytes {
    Bytes::from(idem::held(d).as_millis().to_string())
}

/// A holder's write replied 1 (written) or 0 (lease lost).
fn written(id: &RecordId, reply: Value) -> Result<(), StoreError> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(StoreError::LeaseLost),
        other => Err(StoreError::Corrupt {
            id: id.to_string(),
            reason: format!("write replied {other:?}"),
        }),
    }
}

impl StepJournal for RedisStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let attempt = lease.attempt.to_string();
        let reply = self
            .journal_write(
                &self.inner.scripts.step_begin,
                lease,
                &[step.as_bytes(), attempt.as_bytes()],
            )
            .await?;
        record::step_begin(&lease.id, lease.attempt, reply)
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let reply = self
            .journal_write(
                &self.inner.scripts.step_finish,
                lease,
                &[step.as_bytes(), &result],
            )
            .await?;
        written(&lease.id, reply)
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let key = self.record_key(id);
        let reply = self
            .inner
            .scripts
            .steps
            .run(&self.inner.conn, &key, &[])
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        record::steps(id, reply)
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let key = self.record_key(id);
        let (kind, result): (&[u8], Bytes) = match resolution {
            Resolution::Applied(result) => (b"a", result),
            Resolution::NotApplied => (b"n", Bytes::new()),
        };
        let reply = self
            .inner
            .scripts
            .resolve
            .run(&self.inner.conn, &key, &[step.as_bytes(), kind, &result])
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        record::resolved(id, reply)
    }
}

impl GetRecord for RedisStore {
    /// With replica acknowledgements on, the read counts only once the
    /// replicas have the record as read (it is written again as it is, so
    /// that the `WAIT` behind it covers the writes of other connections):
    /// a read-back never confirms a write a failover could lose.
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let key = self.record_key(id);
        let sync: &[&[u8]] = if self.inner.conn.acks_replicas() {
            &[b"sync"]
        } else {
            &[]
        };
        let reply = self
            .inner
            .scripts
            .get
            .run(&self.inner.conn, &key, sync)
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        Ok(record::record(Some(id), reply)?.map(|(_, r)| r))
    }
}

impl DeleteRecord for RedisStore {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let key = self.record_key(id);
        let reply = self
            .inner
            .scripts
            .delete
            .run(&self.inner.conn, &key, &[&self.inner.grace_ms])
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        Ok(matches!(reply, Value::Int(1)))
    }
}

impl ListRecords for RedisStore {
    /// Lists by scanning the namespace (or, with a scope filter, only that
    /// scope's keys) on every master and sorting what is live. Each page
    /// costs a full scan: this is for administration, not hot paths.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let mut scan = self.scan(query.scope.as_ref()).await?;
        let mut found: Vec<(RecordId, Record)> = Vec::new();
        while let Some(keys) = scan.next(&self.inner.conn).await? {
            let calls: Vec<(String, Vec<Vec<u8>>)> =
                keys.into_iter().map(|k| (k, Vec::new())).collect();
            let replies = self.run_each(&self.inner.scripts.get, &calls).await;
            for ((key, _), reply) in calls.iter().zip(replies) {
                let reply = reply.map_err(|e| damaged(key, e))?;
                let Some((id, record)) = record::record(None, reply)? else {
                    continue;
                };
                let wanted = query.scope.as_ref().is_none_or(|s| id.scope() == s)
                    && query.state.is_none_or(|s| record.state.kind() == s)
                    && query.after.as_ref().is_none_or(|after| id > *after);
                if wanted {
                    found.push((id, record));
                }
            }
        }
        Ok(ListPage::first_of(found, query.limit))
    }
}

impl PurgeExpired for RedisStore {
    /// Redis drops records by itself a grace period after their deadline;
    /// this frees them sooner. Each call scans the namespace until `limit`
    /// records were removed.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let mut scan = self.scan(None).await?;
        let mut purged = 0;
        while purged < limit {
            let Some(keys) = scan.next(&self.inner.conn).await? else {
                break;
            };
            // Each round sends at most as many purges as are still allowed,
            // so a batch never removes more than `limit`, however many of
            // the earlier ones found nothing to remove.
            let mut rest = keys.as_slice();
            while purged < limit && !rest.is_empty() {
                let (chunk, tail) = rest.split_at((limit - purged).min(rest.len()));
                rest = tail;
                let calls: Vec<(String, Vec<Vec<u8>>)> =
                    chunk.iter().map(|k| (k.clone(), Vec::new())).collect();
                let replies = self.run_each(&self.inner.scripts.purge, &calls).await;
                for ((key, _), reply) in calls.iter().zip(replies) {
                    if matches!(reply.map_err(|e| damaged(key, e))?, Value::Int(1)) {
                        purged += 1;
                    }
                }
            }
        }
        Ok(purged)
    }
}
