//! Whether a write commits on its caller's thread or goes to the writer.
//!
//! A write with nothing else in flight commits on the thread that asked,
//! saving the two thread wake-ups of a trip to the writer and back (a lone
//! caller's pairs went from 0.43–0.51 to 0.72–0.78 of plain SQLite's).
//! Under load the same shortcut costs twice: the worker blocked in the
//! commit's fsync serves nobody meanwhile, and a commit of one write is an
//! fsync for one write, where the writer would have committed everyone's
//! together. A gateway's requests do enough between their writes that a
//! write often finds none other in flight while dozens of requests run, so
//! the moment alone does not tell: once a write has met another in flight,
//! writes go to the writer until none has met another for [`QUIET`].
//!
//! On a runtime with one worker (or a current-thread one) no write commits
//! inline: the worker blocked in the commit is the only one that could
//! queue the writes that would share the next one, so every write would
//! pay an fsync of its own (a gateway on one worker went from about 8,000
//! to 1,000 requests a second with unique keys).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long after two writes last overlapped the store still counts as
/// busy.
pub(crate) const QUIET: Duration = Duration::from_millis(100);

/// The writes in flight, and when two last overlapped.
pub(crate) struct Traffic {
    in_flight: AtomicUsize,
    opened: Instant,
    /// When two writes last overlapped, in ms on [`Traffic::now`]'s scale.
    met_at: AtomicU64,
}

/// A write in flight, counted until dropped (also when its future is).
pub(crate) struct InFlight<'a> {
    traffic: &'a Traffic,
    inline: bool,
}

impl Traffic {
    pub(crate) fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            opened: Instant::now(),
            met_at: AtomicU64::new(0),
        }
    }

    /// Counts a write in flight, and decides whether it may commit on its
    /// caller's thread.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let now = self.now();
        let inline = if before > 0 {
            self.met_at.store(now, Ordering::Relaxed);
            false
        } else {
            now.saturating_sub(self.met_at.load(Ordering::Relaxed)) >= millis(QUIET)
                && several_workers()
        };
        InFlight {
            traffic: self,
            inline,
        }
    }

    /// Milliseconds since the store opened, plus [`QUIET`]: a new store
    /// starts quiet.
    fn now(&self) -> u64 {
        millis(self.opened.elapsed() + QUIET)
    }
}

impl InFlight<'_> {
    /// Whether this write may commit on its caller's thread: it found no
    /// other in flight, none has overlapped another for [`QUIET`], and
    /// the runtime has another worker to serve the rest meanwhile.
    pub(crate) fn inline(&self) -> bool {
        self.inline
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.traffic.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether the current runtime is a multi-threaded one with more than one
/// worker.
fn several_workers() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| {
        h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && h.metrics().num_workers() > 1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_write_is_inline_until_two_overlap_then_not_until_quiet() {
        let traffic = Traffic::new();
        assert!(traffic.enter().inline(), "a new store is quiet");
        {
            let first = traffic.enter();
            let second = traffic.enter();
            assert!(first.inline());
            assert!(!second.inline(), "a write that meets another queues");
        }
        assert!(
            !traffic.enter().inline(),
            "alone, but the store was busy just now"
        );
        std::thread::sleep(QUIET + Duration::from_millis(20));
        assert!(traffic.enter().inline(), "quiet again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn one_worker_never_commits_inline() {
        assert!(!Traffic::new().enter().inline());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_current_thread_runtime_never_commits_inline() {
        assert!(!Traffic::new().enter().inline());
    }
}
