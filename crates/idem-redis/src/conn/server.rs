//! A connection to one server that heals itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, ErrorKind, RedisResult, Value};

use super::{Options, ReplicaAcks};
use crate::error::timeout_error;

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

    /// Whether every command waits for replica acknowledgements.
    pub(crate) fn acks_replicas(&self) -> bool {
        self.0.options.replica_acks.is_some()
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
    pub(super) async fn query_acked(
        &self,
        acks: &ReplicaAcks,
        cmd: &Cmd,
        asking: bool,
    ) -> RedisResult<Value> {
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
pub(super) async fn manager(url: &str, options: &Options) -> RedisResult<ConnectionManager> {
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
