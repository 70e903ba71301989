//! How the store connects: the two connection kinds (one server, or a
//! Cluster), the URL they come from, and replica acknowledgements.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, RedisResult, Value};

mod cluster;
mod replicas;
mod server;
pub(crate) mod slots;
pub(crate) mod url;

pub(crate) use cluster::ClusterConn;
pub(crate) use replicas::ReplicaAcks;
pub(crate) use server::{client, Server};
pub(crate) use url::Target;

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
            Conn::Standalone(server) => server.acks_replicas(),
            Conn::Cluster(cluster) => cluster.acks_replicas(),
        }
    }

    /// Connects to `target`.
    pub(crate) async fn open(target: &Target, options: &Options) -> RedisResult<Self> {
        match target {
            Target::Standalone(url) => Ok(Conn::Standalone(Server::connect(url, options).await?)),
            Target::Cluster {
                nodes,
                prefix,
                suffix,
            } => Ok(Conn::Cluster(Arc::new(
                ClusterConn::open(nodes, prefix, suffix, options).await?,
            ))),
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
