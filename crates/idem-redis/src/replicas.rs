//! Writes acknowledged by replicas before they count
//! ([`RedisStoreBuilder::replica_acks`](crate::RedisStoreBuilder::replica_acks)).
//!
//! Redis replicates asynchronously: a master answers a write before any
//! replica has it, and a failover in that window promotes a replica
//! without it. An acknowledged completion is then forgotten and the key
//! runs again. With replica acknowledgements on, every command the store
//! sends goes in one pipeline with `WAIT n timeout`, on the same
//! connection, so the answer counts only once `n` replicas have every
//! write made on that connection so far. Short of `n` in time, the call
//! fails as unavailable: the write is on the master and may still be lost,
//! and the executor treats it as it treats a lost answer.
//!
//! On a Cluster, redirections are followed here rather than by the
//! `redis` crate's Cluster connection, so that the `WAIT` always goes to
//! the node that ran the command (an `ASK` redirection goes as `ASKING`,
//! the command and `WAIT` in one pipeline).

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::conn::{ClusterConn, Server};

/// How many replicas must have a write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// How many times a command is sent again after a redirection or a
/// Cluster that is failing over, before the caller gets the error.
const ATTEMPTS: u32 = 8;

impl ReplicaAcks {
    /// The pipeline: optionally `ASKING`, then `cmd`, then `WAIT`, each
    /// answered on its own (a redirection stays the command's error).
    fn pipe(&self, cmd: &Cmd, asking: bool) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        if asking {
            pipe.add_command(redis::cmd("ASKING")).ignore();
        }
        pipe.add_command(cmd.clone());
        pipe.add_command(self.wait_cmd());
        pipe.ignore_errors();
        pipe
    }

    fn wait_cmd(&self) -> Cmd {
        let ms = self.timeout.as_millis().clamp(1, u128::from(u32::MAX));
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(ms.to_string());
        wait
    }

    /// Passes the command's reply on if `WAIT` answered enough replicas.
    fn check(&self, wait: &Value) -> RedisResult<()> {
        let got = match wait {
            Value::Int(n) => *n,
            other => {
                return Err(RedisError::from((
                    ErrorKind::Parse,
                    "unexpected WAIT reply",
                    format!("{other:?}"),
                )))
            }
        };
        if got >= i64::from(self.replicas) {
            return Ok(());
        }
        Err(RedisError::from(std::io::Error::other(format!(
            "the write reached the master but only {got} of {} replicas acknowledged it within \
             {:?}: a failover now could lose it",
            self.replicas, self.timeout
        ))))
    }

    /// Sends `cmd` to `server` with a `WAIT` behind it (after `ASKING` if
    /// `asking`) and returns the command's reply.
    pub(crate) async fn query(
        &self,
        server: &Server,
        cmd: &Cmd,
        asking: bool,
    ) -> RedisResult<Value> {
        let replies: Vec<RedisResult<Value>> =
            server.check(self.pipe(cmd, asking).query_async(&mut server.get()).await)?;
        let mut replies = replies.into_iter();
        match (replies.next(), replies.next()) {
            (Some(reply), Some(wait)) => {
                let reply = reply?;
                self.check(&wait?)?;
                Ok(reply)
            }
            _ => Err(RedisError::from((
                ErrorKind::Parse,
                "a command and its WAIT got fewer than two answers",
            ))),
        }
    }

    /// Sends `pipe` (in its ignore-errors mode) to `server` with a `WAIT`
    /// behind it; returns each command's result.
    pub(crate) async fn query_pipe(
        &self,
        server: &Server,
        mut pipe: redis::Pipeline,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        pipe.add_command(self.wait_cmd());
        let mut replies: Vec<RedisResult<Value>> =
            server.check(pipe.query_async(&mut server.get()).await)?;
        let wait = replies
            .pop()
            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "a pipeline without its WAIT")))??;
        self.check(&wait)?;
        Ok(replies)
    }

    /// Sends `cmd`, which touches `key` only, to the Cluster node that
    /// owns `key`, following `MOVED` and `ASK` and waiting out a Cluster
    /// that is failing over (`TRYAGAIN`, `CLUSTERDOWN`), with the `WAIT`
    /// on whichever node runs it.
    pub(crate) async fn query_cluster(
        &self,
        cluster: &Arc<ClusterConn>,
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
                None => match cluster.node_for(slot) {
                    Some(node) => (node, false),
                    None => {
                        cluster.load_slots().await?;
                        (cluster.node_for(slot).ok_or_else(no_owner)?, false)
                    }
                },
            };
            let error = match self.query(&node, cmd, asking).await {
                Err(error) => error,
                ok => return ok,
            };
            if attempt >= ATTEMPTS {
                return Err(error);
            }
            match error.kind() {
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
                    let asking = error.kind() == ErrorKind::Server(ServerErrorKind::Ask);
                    let Some((addr, _)) = error.redirect_node() else {
                        return Err(error);
                    };
                    next = Some((cluster.node_at(addr).await?, asking));
                    if !asking {
                        cluster.refresh();
                    }
                }
                ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                    let _ = cluster.load_slots().await;
                }
                _ => {
                    // The command may have run: the caller decides. The
                    // next call goes by a fresh slot map (a master that
                    // died is replaced by its replica).
                    if error.is_io_error() || error.is_connection_dropped() || error.is_timeout() {
                        cluster.refresh();
                    }
                    return Err(error);
                }
            }
        }
    }
}

fn no_owner() -> RedisError {
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::ClusterDown),
        "no master serves the key's slot",
    ))
}
