//! How the store connects: the two connection kinds (one server, or a
//! Cluster) and how their errors map to [`StoreError`].

use std::time::Duration;

use idem::StoreError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::replicas::ReplicaAcks;
use crate::url::Target;

/// How to connect: timeouts that keep a dead server from hanging a
/// caller, and the TLS roots to trust (PEM) if not the platform's.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
    pub(crate) tls_roots: Option<Vec<u8>>,
    /// Replica acknowledgements every command waits for, if any.
    pub(crate) replica_acks: Option<ReplicaAcks>,
}

/// A connection to one server or to a Cluster. Cloning is cheap and
/// clones share the underlying multiplexed connections, so concurrent
/// callers are pipelined on the wire.
#[derive(Clone)]
pub(crate) enum Conn {
    Standalone(Server),
    Cluster(Arc<ClusterConn>),
}

/// A Cluster connection that sends each command straight to the node
/// that owns its key's slot, and replaces itself when requests time out.
///
/// Commands go on a connection per master (each reconnects by itself),
/// chosen from the slot map read with `CLUSTER SLOTS`. A command the node
/// refuses without running it (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`)
/// goes again through the `redis` crate's Cluster connection, which
/// follows redirections, and the slot map is read again in the
/// background. Other errors are the caller's: the command may have run.
///
/// The `redis` crate's Cluster connection can be left with a node
/// connection that never answers again after slots moved under a burst of
/// redirections (seen in this crate's resharding test: one node's
/// requests timed out for minutes while a fresh connection worked at
/// once). A timed-out or dropped request on it therefore starts one
/// background reconnect.
pub(crate) struct ClusterConn {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    reconnecting: AtomicBool,
    direct: RwLock<Option<Arc<Direct>>>,
    refreshing: AtomicBool,
    prefix: String,
    suffix: String,
    options: Options,
}

/// The slot map and a connection per master.
struct Direct {
    /// For each slot, the index of its master in `nodes`.
    owner: Vec<Option<u16>>,
    nodes: Vec<((String, u16), Server)>,
}

impl ClusterConn {
    fn get(&self) -> ClusterConnection {
        self.current.read().clone()
    }

    /// Sends `cmd`, which touches `key` only, to the key's master.
    async fn query_key(self: &Arc<Self>, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        if let Some(acks) = self.options.replica_acks {
            return self.query_key_acked(&acks, cmd, key).await;
        }
        let slot = usize::from(crate::slots::slot(key.as_bytes()));
        let node = self.direct.read().as_ref().and_then(|d| {
            let index = d.owner[slot]?;
            Some(d.nodes[usize::from(index)].1.clone())
        });
        if let Some(node) = node {
            match node.query(cmd).await {
                Err(e) if redirected(&e) => self.refresh(),
                other => return other,
            }
        } else {
            self.refresh();
        }
        self.check(cmd.query_async(&mut self.get()).await)
    }

    /// Sends `cmd`, which touches `key` only, to the node that owns `key`
    /// with a `WAIT` behind it, following `MOVED` and `ASK` and waiting
    /// out a Cluster that is failing over (`TRYAGAIN`, `CLUSTERDOWN`), so
    /// that the `WAIT` goes to whichever node runs the command.
    async fn query_key_acked(
        self: &Arc<Self>,
        acks: &ReplicaAcks,
        cmd: &Cmd,
        key: &str,
    ) -> RedisResult<Value> {
        let slot = crate::slots::slot(key.as_bytes());
        let mut next: Option<(Server, bool)> = None;
        let mut pause = Duration::from_millis(10);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (node, asking) = match next.take() {
                Some(node) => node,
                None => match self.node_for(slot) {
                    Some(node) => (node, false),
                    None => {
                        self.load_slots().await?;
                        (self.node_for(slot).ok_or_else(no_owner)?, false)
                    }
                },
            };
            let error = match node.query_acked(acks, cmd, asking).await {
                Err(error) => error,
                ok => return ok,
            };
            if attempt >= REDIRECTS {
                return Err(error);
            }
            match error.kind() {
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
                    let asking = error.kind() == ErrorKind::Server(ServerErrorKind::Ask);
                    let Some((addr, _)) = error.redirect_node() else {
                        return Err(error);
                    };
                    next = Some((self.node_at(addr).await?, asking));
                    if !asking {
                        self.refresh();
                    }
                }
                ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                    let _ = self.load_slots().await;
                }
                _ => {
                    // The command may have run: the caller decides. The
                    // next call goes by a fresh slot map (a master that
                    // died is replaced by its replica).
                    if error.is_io_error() || error.is_connection_dropped() || error.is_timeout() {
                        self.refresh();
                    }
                    return Err(error);
                }
            }
        }
    }

    /// The connection to the master that owns `slot`, by the slot map.
    fn node_for(&self, slot: u16) -> Option<Server> {
        let direct = self.direct.read();
        let direct = direct.as_ref()?;
        let index = direct.owner[usize::from(slot)]?;
        Some(direct.nodes[usize::from(index)].1.clone())
    }

    /// A connection to the node at `addr` (`host:port`, as a redirection
    /// names it): the slot map's, or a new one.
    async fn node_at(&self, addr: &str) -> RedisResult<Server> {
        let known = self.direct.read().as_ref().and_then(|d| {
            d.nodes
                .iter()
                .find(|((host, port), _)| format!("{host}:{port}") == addr)
                .map(|(_, server)| server.clone())
        });
        match known {
            Some(server) => Ok(server),
            None => {
                let url = format!("{}{addr}{}", self.prefix, self.suffix);
                Server::connect(&url, &self.options).await
            }
        }
    }

    /// Reads the slot map again in the background (one refresh at a time).
    fn refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(error) = this.load_slots().await {
                tracing::debug!(%error, "reading the Cluster's slot map failed");
            }
            this.refreshing.store(false, Ordering::Release);
        });
    }

    /// Reads `CLUSTER SLOTS` and connects to any master not connected yet.
    async fn load_slots(&self) -> RedisResult<()> {
        let reply = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.get())
            .await?;
        let ranges = crate::slots::parse(&reply).ok_or_else(|| {
            RedisError::from((
                ErrorKind::Parse,
                "unexpected CLUSTER SLOTS reply",
                format!("{reply:?}"),
            ))
        })?;
        let old = self.direct.read().clone();
        let mut direct = Direct {
            owner: vec![None; crate::slots::SLOTS],
            nodes: Vec::new(),
        };
        for (first, last, addr) in ranges {
            let index = match direct.nodes.iter().position(|(a, _)| *a == addr) {
                Some(index) => index,
                None => {
                    let known = old
                        .as_ref()
                        .and_then(|d| d.nodes.iter().find(|(a, _)| *a == addr))
                        .map(|(_, c)| c.clone());
                    let conn = match known {
                        Some(conn) => conn,
                        None => {
                            let url =
                                format!("{}{}:{}{}", self.prefix, addr.0, addr.1, self.suffix);
                            Server::connect(&url, &self.options).await?
                        }
                    };
                    direct.nodes.push((addr, conn));
                    direct.nodes.len() - 1
                }
            };
            let index = u16::try_from(index).ok();
            for slot in first..=last.min(crate::slots::SLOTS as u16 - 1) {
                direct.owner[usize::from(slot)] = index;
            }
        }
        *self.direct.write() = Some(Arc::new(direct));
        Ok(())
    }

    fn check<T>(self: &Arc<Self>, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            if (e.is_timeout() || e.is_connection_dropped() || e.is_io_error())
                && !self.reconnecting.swap(true, Ordering::AcqRel)
            {
                let this = Arc::clone(self);
                tokio::spawn(async move {
                    let fresh = tokio::time::timeout(
                        this.options.connect * 3,
                        this.client.get_async_connection(),
                    )
                    .await;
                    if let Ok(Ok(conn)) = fresh {
                        *this.current.write() = conn;
                        tracing::info!("reconnected to the Redis Cluster after a timeout");
                    }
                    this.reconnecting.store(false, Ordering::Release);
                });
            }
        }
        result
    }
}

/// How many times a command with a `WAIT` is sent again after a
/// redirection or a Cluster that is failing over, before the caller gets
/// the error.
const REDIRECTS: u32 = 8;

fn no_owner() -> RedisError {
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::ClusterDown),
        "no master serves the key's slot",
    ))
}

/// Whether the node refused the command without running it because the
/// key's slot is elsewhere or moving.
fn redirected(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
        )
    )
}

/// A connection to one server that heals itself.
///
/// The `redis` crate's `ConnectionManager` reconnects after an I/O error,
/// but when the attempt to connect again fails with anything else it keeps
/// that failed attempt for good: the fault-injection runs (`idem-chaos`)
/// found a store whose every command failed with the same parse error
/// after one reply of the new connection's handshake was cut off. A
/// command failing with a parse error (the byte stream is out of step)
/// therefore replaces the manager in the background, one replacement at a
/// time.
#[derive(Clone)]
pub(crate) struct Server(Arc<ServerInner>);

struct ServerInner {
    url: String,
    options: Options,
    current: RwLock<ConnectionManager>,
    replacing: AtomicBool,
}

impl Server {
    /// Connects to the server at `url`.
    pub(crate) async fn connect(url: &str, options: &Options) -> RedisResult<Self> {
        Ok(Self(Arc::new(ServerInner {
            url: url.to_owned(),
            options: options.clone(),
            current: RwLock::new(manager(url, options).await?),
            replacing: AtomicBool::new(false),
        })))
    }

    /// The current connection (cheap: it is shared).
    pub(crate) fn get(&self) -> ConnectionManager {
        self.0.current.read().clone()
    }

    /// Sends one command (with a `WAIT` behind it when replica
    /// acknowledgements are on).
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self.0.options.replica_acks {
            Some(acks) => self.query_acked(&acks, cmd, false).await,
            None => self.check(cmd.query_async(&mut self.get()).await),
        }
    }

    /// Sends `cmd` with a `WAIT` behind it (after `ASKING` if `asking`)
    /// and returns the command's reply.
    async fn query_acked(&self, acks: &ReplicaAcks, cmd: &Cmd, asking: bool) -> RedisResult<Value> {
        let pipe = acks.pipe(cmd, asking);
        let replies = self.check(pipe.query_async(&mut self.get()).await)?;
        acks.answer(replies)
    }

    /// Sends `pipe` (in its ignore-errors mode) as one pipeline, with a
    /// `WAIT` behind it when replica acknowledgements are on; returns each
    /// command's result.
    pub(crate) async fn query_pipe(
        &self,
        pipe: redis::Pipeline,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        match self.0.options.replica_acks {
            Some(acks) => {
                let pipe = acks.with_wait(pipe);
                acks.answer_all(self.check(pipe.query_async(&mut self.get()).await)?)
            }
            None => self.check(pipe.query_async(&mut self.get()).await),
        }
    }

    /// Passes `result` on, replacing the connection first (in the
    /// background) if it says the connection is out of step.
    pub(crate) fn check<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            if e.kind() == ErrorKind::Parse && !self.0.replacing.swap(true, Ordering::AcqRel) {
                let inner = Arc::clone(&self.0);
                tokio::spawn(async move {
                    match manager(&inner.url, &inner.options).await {
                        Ok(fresh) => {
                            *inner.current.write() = fresh;
                            tracing::info!("replaced a Redis connection after a garbled reply");
                        }
                        Err(error) => {
                            tracing::debug!(%error, "replacing a Redis connection failed");
                        }
                    }
                    inner.replacing.store(false, Ordering::Release);
                });
            }
        }
        result
    }
}

/// A client for the server at `url`, with TLS roots if given.
pub(crate) fn client(url: &str, options: &Options) -> RedisResult<redis::Client> {
    match &options.tls_roots {
        #[cfg(feature = "tls")]
        Some(roots) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(roots.clone()),
            },
        ),
        _ => redis::Client::open(url),
    }
}

/// A self-reconnecting connection to the server at `url`.
async fn manager(url: &str, options: &Options) -> RedisResult<ConnectionManager> {
    let client = client(url, options)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.connect))
        .set_response_timeout(Some(options.response))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    tokio::time::timeout(
        options.connect + options.response,
        ConnectionManager::new_with_config(client, config),
    )
    .await
    .map_err(|_| timeout_error("connecting"))?
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Standalone(_) => "Conn::Standalone",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl Conn {
    /// Whether every command waits for replica acknowledgements.
    pub(crate) fn acks_replicas(&self) -> bool {
        match self {
            Conn::Standalone(server) => server.0.options.replica_acks.is_some(),
            Conn::Cluster(cluster) => cluster.options.replica_acks.is_some(),
        }
    }

    pub(crate) async fn open(target: &Target, options: &Options) -> RedisResult<Self> {
        match target {
            Target::Standalone(url) => Ok(Conn::Standalone(Server::connect(url, options).await?)),
            Target::Cluster {
                nodes,
                prefix,
                suffix,
            } => {
                let builder = ClusterClientBuilder::new(nodes.clone());
                #[cfg(feature = "tls")]
                let builder = match &options.tls_roots {
                    Some(roots) => builder.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(roots.clone()),
                    }),
                    None => builder,
                };
                let client = builder
                    .connection_timeout(options.connect)
                    .response_timeout(options.response)
                    .overall_response_timeout(Some(options.response * 4))
                    .retries(6)
                    .min_retry_wait(10)
                    .max_retry_wait(250)
                    .build()?;
                let conn = tokio::time::timeout(
                    options.connect * 2 + options.response,
                    client.get_async_connection(),
                )
                .await
                .map_err(|_| timeout_error("connecting"))??;
                let cluster = ClusterConn {
                    client,
                    current: RwLock::new(conn),
                    reconnecting: AtomicBool::new(false),
                    direct: RwLock::new(None),
                    refreshing: AtomicBool::new(false),
                    prefix: prefix.clone(),
                    suffix: suffix.clone(),
                    options: options.clone(),
                };
                cluster.load_slots().await?;
                Ok(Conn::Cluster(Arc::new(cluster)))
            }
        }
    }

    /// Sends one command, routed by its key on a Cluster.
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::Standalone(c) => c.query(cmd).await,
            Conn::Cluster(c) => c.check(cmd.query_async(&mut c.get()).await),
        }
    }

    /// Sends `cmd`, which touches `key` only (routed by it on a Cluster).
    pub(crate) async fn query_key(&self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        match self {
            Conn::Standalone(c) => c.query(cmd).await,
            Conn::Cluster(c) => c.query_key(cmd, key).await,
        }
    }

    /// Sends `cmd` to the Cluster master at `node`; `None` is the one
    /// server of a standalone connection.
    pub(crate) async fn query_node(
        &self,
        cmd: Cmd,
        node: Option<(String, u16)>,
    ) -> RedisResult<Value> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let route =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                c.check(c.get().route_command(cmd, route).await)
            }
            _ => self.query(&cmd).await,
        }
    }
}

pub(crate) fn timeout_error(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("timed out {what}"),
    ))
}

/// Server error codes after which the command did not run (or may not
/// have) and a later try can succeed: a script running too long (`BUSY`),
/// a server loading its data, a replica or a demoted master (`READONLY`),
/// a master down or a Cluster resharding or failing (`MASTERDOWN`,
/// `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`, `ASK`), too few replicas for
/// `min-replicas-to-write` (`NOREPLICAS`), and memory full under
/// `maxmemory` (`OOM`, resource exhaustion, DESIGN §5.5).
const TRANSIENT_CODES: &[&str] = &[
    "BUSY",
    "LOADING",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "NOREPLICAS",
    "OOM",
];

/// Whether a server error code is transient ([`TRANSIENT_CODES`]).
pub(crate) fn transient_code(code: &str) -> bool {
    TRANSIENT_CODES.contains(&code)
}

/// Whether the error means the server (or the Cluster) could not serve
/// the request, or its answer was lost: not reachable, timed out, a reply
/// cut off or garbled on the way (the command may have run: it is read
/// back, never taken as a refusal), or a transient error code
/// ([`TRANSIENT_CODES`]).
pub(crate) fn is_unavailable(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::ClusterConnectionNotFound | ErrorKind::Parse
        )
        || error.code().is_some_and(transient_code)
}

/// Maps a `redis` error to the store's error: unreachable servers and
/// transient errors are [`StoreError::Unavailable`] (the executor retries
/// within the lease and fails closed), anything else is a definite
/// refusal, [`StoreError::Backend`].
pub(crate) fn store_error(error: RedisError) -> StoreError {
    if is_unavailable(&error) {
        StoreError::Unavailable(Box::new(error))
    } else {
        StoreError::Backend(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::transient_code;

    #[test]
    fn busy_loading_failovers_reshards_and_shortages_are_transient() {
        for code in [
            "BUSY",
            "LOADING",
            "READONLY",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "MOVED",
            "ASK",
            "NOREPLICAS",
            "OOM",
        ] {
            assert!(transient_code(code), "{code}");
        }
        for code in [
            "ERR",
            "WRONGTYPE",
            "NOSCRIPT",
            "NOPERM",
            "CROSSSLOT",
            "EXECABORT",
        ] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
