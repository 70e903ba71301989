//! Time as idem sees it: [`Timestamp`] (milliseconds since the Unix epoch),
//! and the [`Clock`] that local stores read once per operation.
//!
//! Networked stores decide with the server's clock instead; local stores
//! take a `Clock` so tests can move time with a [`ManualClock`] rather than
//! sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest lease or retention a store keeps: a century. Every store
/// takes any duration up to `Duration::MAX` ("forever"), and keeps a
/// longer one for this long, since some cannot write a later time
/// (PostgreSQL's intervals and Redis's script numbers overflow). No record
/// outlives it in practice.
pub const LONGEST_HELD: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a store keeps for a lease or retention of `d`: `d`, at most
/// [`LONGEST_HELD`].
pub fn held(d: Duration) -> Duration {
    d.min(LONGEST_HELD)
}

/// A point in time, in milliseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The epoch itself.
    pub const ZERO: Timestamp = Timestamp(0);

    /// A timestamp from milliseconds since the epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating at the far future.
    pub fn saturating_add(self, d: Duration) -> Self {
        Self(self.0.saturating_add(duration_millis(d)))
    }

    /// `self - d`, saturating at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(self.0.saturating_sub(duration_millis(d)))
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// The current system time.
    pub fn now() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self(duration_millis(since))
    }
}

/// Milliseconds in `d`, rounded up so a non-zero duration never becomes 0,
/// saturating at `u64::MAX`.
pub(crate) fn duration_millis(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}ms)", self.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

/// A source of the current time for local stores and the executor.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to. Clones share the same time, so a
/// test can hold one and give another to the store.
///
/// ```
/// use idem::{Clock, ManualClock, Timestamp};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// let store_clock = clock.clone();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(store_clock.now(), Timestamp::from_millis(6_000));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start.as_millis())),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Sets the clock to `t` (it may move backwards, to test skew).
    pub fn set(&self, t: Timestamp) {
        self.now.store(t.as_millis(), Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    /// A clock stopped at 2026-01-01T00:00:00Z.
    fn default() -> Self {
        Self::new(Timestamp::from_millis(1_767_225_600_000))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.now.load(Ordering::SeqCst))
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_millis() {
        assert_eq!(duration_millis(Duration::from_nanos(1)), 1);
        assert_eq!(duration_millis(Duration::from_millis(5)), 5);
        assert_eq!(duration_millis(Duration::MAX), u64::MAX);
        assert_eq!(
            Timestamp::from_millis(10)
                .saturating_add(Duration::MAX)
                .as_millis(),
            u64::MAX
        );
        assert_eq!(
            Timestamp::from_millis(10).since(Timestamp::from_millis(20)),
            Duration::ZERO
        );
    }
}
