//! Waiting for a record to change, woken by Redis.
//!
//! The scripts that end a claim (complete, fail, release, and the admin's
//! delete) `PUBLISH` on the record's own channel, `<record key>:done`,
//! which carries the record's hash tag. A waiter subscribes to that channel
//! on one pub/sub connection the store opens when it first waits (on a
//! Cluster, a connection to one node: Redis Cluster passes every publish
//! to every node), then looks at the record, then sleeps until the message
//! comes or its time is up ([`idem::wake`], whose slow poll stays
//! underneath as a safety net for a message lost with a dropped
//! connection); without a pub/sub connection the wait falls back to
//! [`idem::store::poll_while`]. The last wait on a channel unsubscribes, after
//! any subscribe in flight on the connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idem::wake::{Waiter, Waiters};
use redis::aio::PubSubSink;

use crate::conn::{self, Options};
use crate::error::timeout_error;

/// The channel a record's end is published on (see `lua/prelude.lua`).
pub(crate) fn channel(record_key: &str) -> String {
    format!("{record_key}:done")
}

/// The waiters of one store.
pub(crate) struct Notifier {
    url: String,
    options: Options,
    waiters: Arc<Waiters>,
    /// The pub/sub connection's sending half, once connected. Subscribing
    /// and unsubscribing hold it, so the two never cross.
    sink: Arc<tokio::sync::Mutex<Option<PubSubSink>>>,
}

// By hand: the URL may hold a password and the options TLS roots.
impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("waiters", &self.waiters)
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// Waiters that subscribe at `url` (a server, or any Cluster node).
    pub(crate) fn new(url: String, options: Options) -> Self {
        Self {
            url,
            options,
            waiters: Arc::default(),
            sink: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    /// Waits until the record whose channel is `channel` may have changed,
    /// or `timeout` passes: returns at once when `still_waiting` (one cheap
    /// read of the record) says it is no longer in progress.
    pub(crate) async fn wait<F, Fut>(&self, channel: String, timeout: Duration, still_waiting: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let subscription = Subscription {
            notifier: self,
            waiter: self.waiters.enter(channel),
        };
        let waiter = &subscription.waiter;
        let subscribed = if waiter.is_first() {
            let ok = self.subscribe(waiter.channel()).await;
            waiter.set_listening(ok);
            ok
        } else {
            waiter.is_listening()
        };
        if subscribed {
            waiter.wait(timeout, still_waiting).await;
        } else {
            idem::store::poll_while(timeout, still_waiting).await;
        }
    }

    /// Subscribes to `channel`, connecting first if needed. `false` if
    /// that failed (the waiter polls instead).
    async fn subscribe(&self, channel: &str) -> bool {
        let mut sink = self.sink.lock().await;
        if sink.is_none() {
            match self.connect().await {
                Ok(connected) => *sink = Some(connected),
                Err(error) => {
                    tracing::debug!(%error, "no pub/sub connection; waiting by polling");
                    return false;
                }
            }
        }
        let Some(connected) = sink.as_mut() else {
            return false;
        };
        let subscribed = tokio::time::timeout(self.options.response, connected.subscribe(channel))
            .await
            .map_err(|_| timeout_error("subscribing"))
            .and_then(|r| r);
        match subscribed {
            Ok(()) => true,
            Err(error) => {
                tracing::debug!(%error, "subscribing failed; waiting by polling");
                // A broken connection is opened afresh by the next waiter.
                *sink = None;
                false
            }
        }
    }

    /// Opens the pub/sub connection and the task that wakes waiters on its
    /// messages. When the connection ends, every waiter is woken (each then
    /// looks at its record again) and the next one connects anew.
    async fn connect(&self) -> redis::RedisResult<PubSubSink> {
        let client = conn::client(&self.url, &self.options)?;
        let pubsub = tokio::time::timeout(
            self.options.connect + self.options.response,
            client.get_async_pubsub(),
        )
        .await
        .map_err(|_| timeout_error("connecting for pub/sub"))??;
        let (sink, mut stream) = pubsub.split();
        let waiters = Arc::clone(&self.waiters);
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                waiters.wake(message.get_channel_name());
            }
            waiters.wake_all();
        });
        Ok(sink)
    }
}

/// A wait on a channel; the last one to leave unsubscribes.
struct Subscription<'a> {
    notifier: &'a Notifier,
    waiter: Waiter,
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        if !self.waiter.leave().last {
            return;
        }
        // Also when the channel was never marked listening: a first wait
        // cut off inside its SUBSCRIBE may have subscribed. Unsubscribing
        // waits for the connection's lock (another wait may be subscribing
        // with it) and is skipped if a new wait came for the channel
        // meanwhile; only a wait dropped outside a runtime leaves its
        // channel subscribed (harmless: its messages find no one).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (sink, waiters) = (
            Arc::clone(&self.notifier.sink),
            Arc::clone(&self.notifier.waiters),
        );
        let (channel, limit) = (
            self.waiter.channel().to_owned(),
            self.notifier.options.response,
        );
        runtime.spawn(async move {
            let mut sink = sink.lock().await;
            if waiters.is_waited(&channel) {
                return;
            }
            if let Some(sink) = sink.as_mut() {
                let _ = tokio::time::timeout(limit, sink.unsubscribe(channel)).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_shows_no_password() {
        let options = Options {
            connect: Duration::from_secs(1),
            response: Duration::from_secs(1),
            tls_roots: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            replica_acks: None,
        };
        let notifier = Notifier::new("redis://:hunter2@127.0.0.1:6379".into(), options);
        let shown = format!("{notifier:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("CERTIFICATE"), "{shown}");
    }
}
