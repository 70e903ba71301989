//! Waiting for a record to change, woken by the store's own notifications:
//! the shared half of a [`Store::wait_for_change`](crate::Store::wait_for_change)
//! for stores that can notify (Redis pub/sub, PostgreSQL LISTEN/NOTIFY).
//!
//! A store keeps one [`Waiters`] and one connection that receives its
//! notifications. The task reading that connection calls
//! [`Waiters::wake`] with each message's channel, and [`Waiters::wake_all`]
//! when the connection ends. A wait [`enter`](Waiters::enter)s the channel
//! its record's end is announced on, and then [`Waiter::wait`]s: it looks at
//! the record once, then sleeps until a message, its deadline, or the
//! [`SAFETY_NET`] interval, when it looks again (a message lost with a
//! dropped connection must not cost a whole wait).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often a waiter looks at its record even when no message came.
pub const SAFETY_NET: Duration = Duration::from_secs(1);

/// The waits of one store, by channel. Share it as `Arc<Waiters>`.
#[derive(Default)]
pub struct Waiters {
    channels: Mutex<HashMap<String, Channel>>,
}

struct Channel {
    notify: Arc<Notify>,
    count: usize,
    listening: bool,
}

impl std::fmt::Debug for Waiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters")
            .field("channels", &self.channels.lock().len())
            .finish()
    }
}

impl Waiters {
    /// Counts a wait on `channel`. The first wait on a channel finds it not
    /// listening: it sets that up and says so with
    /// [`Waiter::set_listening`]; later waits read [`Waiter::is_listening`].
    pub fn enter(self: &Arc<Self>, channel: impl Into<String>) -> Waiter {
        let channel = channel.into();
        let mut channels = self.channels.lock();
        let c = channels.entry(channel.clone()).or_insert_with(|| Channel {
            notify: Arc::new(Notify::new()),
            count: 0,
            listening: false,
        });
        c.count += 1;
        Waiter {
            notify: Arc::clone(&c.notify),
            first: c.count == 1,
            waiters: Arc::clone(self),
            channel,
            left: false,
        }
    }

    /// Wakes every wait on `channel` (a message came).
    pub fn wake(&self, channel: &str) {
        if let Some(c) = self.channels.lock().get(channel) {
            c.notify.notify_waiters();
        }
    }

    /// Wakes every wait, and marks every channel as no longer listening
    /// (the connection that carried the messages ended).
    pub fn wake_all(&self) {
        for c in self.channels.lock().values_mut() {
            c.listening = false;
            c.notify.notify_waiters();
        }
    }

    /// The number of channels waited on.
    pub fn channels(&self) -> usize {
        self.channels.lock().len()
    }

    /// Whether any wait is on `channel` now.
    pub fn is_waited(&self, channel: &str) -> bool {
        self.channels.lock().contains_key(channel)
    }
}

/// One wait on a channel, from [`Waiters::enter`]; it leaves the channel
/// when dropped, however the wait ended.
#[derive(Debug)]
pub struct Waiter {
    waiters: Arc<Waiters>,
    channel: String,
    notify: Arc<Notify>,
    first: bool,
    left: bool,
}

/// What a wait found when it left its channel ([`Waiter::leave`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    /// No other wait is on the channel any more.
    pub last: bool,
    /// The channel was listening (for the last wait: time to stop).
    pub listening: bool,
}

impl Waiter {
    /// The channel waited on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// Whether this is the first wait on its channel (the one that sets up
    /// listening).
    pub fn is_first(&self) -> bool {
        self.first
    }

    /// Records whether messages on the channel now reach this store.
    pub fn set_listening(&self, listening: bool) {
        if let Some(c) = self.waiters.channels.lock().get_mut(&self.channel) {
            c.listening = listening;
        }
    }

    /// Whether messages on the channel reach this store.
    pub fn is_listening(&self) -> bool {
        self.waiters
            .channels
            .lock()
            .get(&self.channel)
            .is_some_and(|c| c.listening)
    }

    /// Waits until a message on the channel, or `timeout`: returns at once
    /// when `still_waiting` (one cheap read of the record) says the record
    /// is no longer in progress, and calls it again every [`SAFETY_NET`].
    pub async fn wait<F, Fut>(&self, timeout: Duration, mut still_waiting: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            // Registered before looking, so a message in between wakes it.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !still_waiting().await {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            tokio::select! {
                () = &mut notified => return,
                () = tokio::time::sleep_until(deadline.min(now + SAFETY_NET)) => {}
            }
        }
    }

    /// Leaves the channel now, saying whether this was the last wait on
    /// it (for a store that stops listening then). Leaving again, or the
    /// drop after it, does nothing.
    pub fn leave(&mut self) -> Left {
        let gone = Left {
            last: false,
            listening: false,
        };
        if std::mem::replace(&mut self.left, true) {
            return gone;
        }
        let mut channels = self.waiters.channels.lock();
        let Some(c) = channels.get_mut(&self.channel) else {
            return gone;
        };
        c.count -= 1;
        let left = Left {
            last: c.count == 0,
            listening: c.listening,
        };
        if left.last {
            channels.remove(&self.channel);
        }
        left
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_message_wakes_every_wait_on_its_channel_and_no_other() {
        let waiters = Arc::new(Waiters::default());
        let (a, b, other) = (
            waiters.enter("k"),
            waiters.enter("k"),
            waiters.enter("other"),
        );
        assert!(a.is_first() && !b.is_first() && other.is_first());
        let waits = async {
            let start = Instant::now();
            tokio::join!(
                a.wait(Duration::from_secs(30), || async { true }),
                b.wait(Duration::from_secs(30), || async { true }),
            );
            start.elapsed()
        };
        let woken = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            waiters.wake("k");
        };
        let (elapsed, ()) = tokio::join!(waits, woken);
        assert_eq!(elapsed, Duration::from_millis(100));
        let start = Instant::now();
        other
            .wait(Duration::from_millis(2500), || async { true })
            .await;
        assert_eq!(start.elapsed(), Duration::from_millis(2500), "not woken");
    }

    #[tokio::test(start_paused = true)]
    async fn the_record_is_read_once_per_safety_net_and_an_end_returns_at_once() {
        let waiters = Arc::new(Waiters::default());
        let waiter = waiters.enter("k");
        let reads = std::sync::atomic::AtomicUsize::new(0);
        let start = Instant::now();
        waiter
            .wait(Duration::from_millis(3500), || async {
                reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 2
            })
            .await;
        assert_eq!(reads.into_inner(), 3);
        assert_eq!(start.elapsed(), SAFETY_NET * 2);
    }

    #[test]
    fn the_last_wait_to_leave_says_so_and_the_channel_is_gone() {
        let waiters = Arc::new(Waiters::default());
        let (mut a, mut b) = (waiters.enter("k"), waiters.enter("k"));
        a.set_listening(true);
        assert!(b.is_listening());
        assert_eq!(
            a.leave(),
            Left {
                last: false,
                listening: true
            }
        );
        waiters.wake_all();
        assert!(!b.is_listening(), "the connection ended");
        assert_eq!(
            b.leave(),
            Left {
                last: true,
                listening: false
            }
        );
        assert_eq!(waiters.channels(), 0);
        drop(waiters.enter("dropped"));
        assert_eq!(waiters.channels(), 0, "a dropped wait leaves too");
    }
}
