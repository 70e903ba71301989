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
//! This module builds those pipelines and reads their answers; the
//! connections (`conn.rs`) send them. On a Cluster, redirections are then
//! followed by the store rather than by the `redis` crate's Cluster
//! connection, so that the `WAIT` always goes to the node that ran the
//! command (an `ASK` redirection goes as `ASKING`, the command and `WAIT`
//! in one pipeline).

use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};

/// How many replicas must have a write, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl ReplicaAcks {
    /// The pipeline: optionally `ASKING`, then `cmd`, then `WAIT`, each
    /// answered on its own (a redirection stays the command's error).
    pub(crate) fn pipe(&self, cmd: &Cmd, asking: bool) -> redis::Pipeline {
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

    /// The command's reply from the answers to [`pipe`](Self::pipe), if
    /// `WAIT` answered enough replicas.
    pub(crate) fn answer(&self, replies: Vec<RedisResult<Value>>) -> RedisResult<Value> {
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

    /// `pipe` (in its ignore-errors mode) with a `WAIT` behind it.
    pub(crate) fn with_wait(&self, mut pipe: redis::Pipeline) -> redis::Pipeline {
        pipe.add_command(self.wait_cmd());
        pipe
    }

    /// Each command's result from the answers to
    /// [`with_wait`](Self::with_wait), if `WAIT` answered enough replicas.
    pub(crate) fn answer_all(
        &self,
        mut replies: Vec<RedisResult<Value>>,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        let wait = replies
            .pop()
            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "a pipeline without its WAIT")))??;
        self.check(&wait)?;
        Ok(replies)
    }
}
