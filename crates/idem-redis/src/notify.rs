//! Waiting for a record to change, woken by Redis.
//!
//! The scripts that end a claim (complete, fail, release, and the admin's
//! delete) `PUBLISH` on the record's own channel, `<record key>:done`,
//! which carries the record's hash tag. A waiter subscribes to that channel
//! on one pub/sub connection the store opens when it first waits (on a
//! Cluster, a connection to one node: Redis Cluster passes every publish
//! to every node), then looks at the record, then sleeps until the message
//! comes or its time is up. A slow poll stays underneath as a safety net
//! (a message lost with a dropped connection, an unsubscribe that raced a
//! new subscription); without a pub/sub connection the wait falls back to
//! [`idem::poll_while`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use parking_lot::Mutex;
use redis::aio::PubSubSink;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::conn::{self, Options};

/// How often a subscribed waiter looks at the record anyway.
const SAFETY_NET: Duration = Duration::from_secs(1);

/// The channel a record's end is published on (see `lua/prelude.lua`).
pub(crate) fn channel(record_key: &str) -> String {
    format!("{record_key}:done")
}

/// The waiters of one store.
pub(crate) struct Notifier {
    url: String,
    options: Options,
    shared: Arc<Shared>,
    /// The pub/sub connection's sending half, once connected.
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("channels", &self.shared.waiting.lock().len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Shared {
    /// Waiters per channel.
    waiting: Mutex<HashMap<String, Waiting>>,
}

struct Waiting {
    notify: Arc<Notify>,
    count: usize,
    subscribed: bool,
}

impl Notifier {
    /// Waiters that subscribe at `url` (a server, or any Cluster node).
    pub(crate) fn new(url: String, options: Options) -> Self {
        Self {
            url,
            options,
            shared: Arc::default(),
            sink: tokio::sync::Mutex::new(None),
        }
    }

    /// Waits until the record whose channel is `channel` may have changed,
    /// or `timeout` passes: returns at once when `still_waiting` (one cheap
    /// read of the record) says it is no longer in progress.
    pub(crate) async fn wait<F, Fut>(
        &self,
        channel: String,
        timeout: Duration,
        mut still_waiting: F,
    ) where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        let (notify, first) = self.register(&channel);
        let _registered = Registered {
            notifier: self,
            channel: &channel,
        };
        let subscribed = if first {
            let ok = self.subscribe(&channel).await;
            if let Some(w) = self.shared.waiting.lock().get_mut(&channel) {
                w.subscribed = ok;
            }
            ok
        } else {
            self.shared
                .waiting
                .lock()
                .get(&channel)
                .is_some_and(|w| w.subscribed)
        };
        if !subscribed {
            return idem::poll_while(timeout, still_waiting).await;
        }
        loop {
            // Registered before looking, so a publish in between wakes it.
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !still_waiting().await {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let nap = deadline.min(now + SAFETY_NET);
            tokio::select! {
                () = &mut notified => return,
                () = tokio::time::sleep_until(nap) => {}
            }
        }
    }

    /// Counts a waiter on `channel`; `true` if it is the first.
    fn register(&self, channel: &str) -> (Arc<Notify>, bool) {
        let mut waiting = self.shared.waiting.lock();
        let w = waiting
            .entry(channel.to_owned())
            .or_insert_with(|| Waiting {
                notify: Arc::new(Notify::new()),
                count: 0,
                subscribed: false,
            });
        w.count += 1;
        (Arc::clone(&w.notify), w.count == 1)
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
            .map_err(|_| conn::timeout_error("subscribing"))
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
        .map_err(|_| conn::timeout_error("connecting for pub/sub"))??;
        let (sink, mut stream) = pubsub.split();
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            while let Some(message) = stream.next().await {
                let waiting = shared.waiting.lock();
                if let Some(w) = waiting.get(message.get_channel_name()) {
                    w.notify.notify_waiters();
                }
            }
            let mut waiting = shared.waiting.lock();
            for w in waiting.values_mut() {
                w.subscribed = false;
                w.notify.notify_waiters();
            }
        });
        Ok(sink)
    }
}

/// Takes a waiter off its channel when it stops waiting, however it
/// stops; the last one unsubscribes.
struct Registered<'a> {
    notifier: &'a Notifier,
    channel: &'a str,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut waiting = self.notifier.shared.waiting.lock();
        let Some(w) = waiting.get_mut(self.channel) else {
            return;
        };
        w.count -= 1;
        if w.count > 0 {
            return;
        }
        let subscribed = w.subscribed;
        waiting.remove(self.channel);
        drop(waiting);
        if !subscribed {
            return;
        }
        // A waiter dropped outside a runtime (or while another subscribes)
        // leaves the channel subscribed: harmless, its messages find no one.
        let (Ok(runtime), Ok(sink)) = (
            tokio::runtime::Handle::try_current(),
            self.notifier.sink.try_lock(),
        ) else {
            return;
        };
        if let Some(mut sink) = sink.clone() {
            let channel = self.channel.to_owned();
            runtime.spawn(async move {
                let _ = sink.unsubscribe(channel).await;
            });
        }
    }
}
