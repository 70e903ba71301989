//! A store clock for tests that pause tokio's clock.

use idem::{Clock, Timestamp};

/// A store clock that follows tokio's (pausable) clock: a store built
/// with it sees leases and retentions run out as `tokio::time::advance`
/// (or a paused runtime's auto-advance) moves time, from 1,000 s at its
/// creation.
#[derive(Debug, Clone)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that starts now, by tokio's clock.
    pub fn new() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(1_000_000).saturating_add(self.start.elapsed())
    }
}
