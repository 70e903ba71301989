//! Whether a claim reads its key before it goes to the writer.
//!
//! A claim that will only report what is there (a duplicate in progress, an
//! outcome the executor's cache does not hold, a mismatch) is answered from
//! a read snapshot, without the writer. A first delivery finds nothing
//! there and goes to the writer all the same: for a run of new keys (a
//! gateway's unique traffic, a consumer's first deliveries) the read is
//! wasted, 6 % of such a request's instructions (BENCHMARKS.md). So the
//! read is skipped once the last [`SKIP_AFTER`] claims all found their
//! keys new, and made again from the first claim whose key was there (the
//! writer's answer tells it) or that the writer could not answer (so that
//! while it fails, the read still answers what the file holds).
//!
//! Skipping never changes an answer: the writer decides every claim it
//! gets under the write lock, whatever a read would have said.

use std::sync::atomic::{AtomicU32, Ordering};

/// How many claims in a row must find their keys new before the read is
/// skipped.
pub(crate) const SKIP_AFTER: u32 = 16;

/// Claims in a row whose keys were new, up to [`SKIP_AFTER`].
#[derive(Debug, Default)]
pub(crate) struct Peek {
    new_in_a_row: AtomicU32,
}

impl Peek {
    /// Whether the next claim should read its key first.
    pub(crate) fn worth_it(&self) -> bool {
        self.new_in_a_row.load(Ordering::Relaxed) < SKIP_AFTER
    }

    /// A claim found its key there (answered without acquiring) or new.
    pub(crate) fn saw(&self, there: bool) {
        let count = self.new_in_a_row.load(Ordering::Relaxed);
        if there {
            if count != 0 {
                self.new_in_a_row.store(0, Ordering::Relaxed);
            }
        } else if count < SKIP_AFTER {
            // Racing claims may lose a count: the read goes on a little
            // longer, which is only what it was before.
            self.new_in_a_row.store(count + 1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_stops_after_a_run_of_new_keys_and_resumes_at_one_that_was_there() {
        let peek = Peek::default();
        for _ in 0..SKIP_AFTER {
            assert!(peek.worth_it());
            peek.saw(false);
        }
        assert!(!peek.worth_it(), "a run of new keys");
        peek.saw(false);
        assert!(!peek.worth_it());
        peek.saw(true);
        assert!(peek.worth_it(), "a key that was there");
    }
}
