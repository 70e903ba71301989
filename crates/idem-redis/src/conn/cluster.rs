//! A Cluster connection that routes by slot itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::{slots, Options, ReplicaAcks, Server};
use crate::error::timeout_error;

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
    pub(super) fn get(&self) -> ClusterConnection {
        self.current.read().clone()
    }

    /// Sends `cmd`, which touches `key` only, to the key's master.
    pub(super) async fn query_key(self: &Arc<Self>, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        if let Some(acks) = self.options.replica_acks {
            return self.query_key_acked(&acks, cmd, key).await;
        }
        let slot = usize::from(slots::slot(key.as_bytes()));
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
        let slot = slots::slot(key.as_bytes());
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
        let ranges = slots::parse(&reply).ok_or_else(|| {
            RedisError::from((
                ErrorKind::Parse,
                "unexpected CLUSTER SLOTS reply",
                format!("{reply:?}"),
            ))
        })?;
        let old = self.direct.read().clone();
        let mut direct = Direct {
            owner: vec![None; slots::SLOTS],
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
            for slot in first..=last.min(slots::SLOTS as u16 - 1) {
                direct.owner[usize::from(slot)] = index;
            }
        }
        *self.direct.write() = Some(Arc::new(direct));
        Ok(())
    }

    pub(super) fn check<T>(self: &Arc<Self>, result: RedisResult<T>) -> RedisResult<T> {
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

impl ClusterConn {
    /// Whether every command waits for replica acknowledgements.
    pub(crate) fn acks_replicas(&self) -> bool {
        self.options.replica_acks.is_some()
    }

    /// Connects to the Cluster from its seed `nodes` and reads its slot
    /// map.
    pub(crate) async fn open(
        nodes: &[String],
        prefix: &str,
        suffix: &str,
        options: &Options,
    ) -> RedisResult<Self> {
        let builder = ClusterClientBuilder::new(nodes.to_vec());
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
        let cluster = Self {
            client,
            current: RwLock::new(conn),
            reconnecting: AtomicBool::new(false),
            direct: RwLock::new(None),
            refreshing: AtomicBool::new(false),
            prefix: prefix.to_owned(),
            suffix: suffix.to_owned(),
            options: options.clone(),
        };
        cluster.load_slots().await?;
        Ok(cluster)
    }
}
