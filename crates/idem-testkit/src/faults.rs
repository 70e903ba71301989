//! A seeded fault schedule for fault-injection runs: when the next fault
//! comes and which kind it is. Each round deals every kind once, in a
//! seeded order, so even a short run sees them all; the same seed gives
//! the same faults at the same offsets.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Seeded fault times and kinds: each round injects every kind once, in a
/// seeded order, so even a short run sees them all.
pub struct Schedule<K> {
    /// The fault stream's own random numbers, also for each fault's
    /// details, so the workload's shape does not move the faults.
    pub rng: StdRng,
    kinds: Vec<K>,
    deck: Vec<K>,
    next: Instant,
    mean: Duration,
    /// Faults injected so far, by kind.
    pub counts: BTreeMap<K, u64>,
}

impl<K: Copy + Ord> Schedule<K> {
    /// Faults of `kinds`, about `mean` apart from `start` on, seeded by
    /// `seed`.
    pub fn new(seed: u64, kinds: Vec<K>, mean: Duration, start: Instant) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let next = start + mean.mul_f64(rng.random_range(0.5..1.5));
        Self {
            rng,
            kinds,
            deck: Vec::new(),
            next,
            mean,
            counts: BTreeMap::new(),
        }
    }

    /// The kind of fault due at `now`, if one is.
    pub fn due(&mut self, now: Instant) -> Option<K> {
        if now < self.next || self.kinds.is_empty() {
            return None;
        }
        self.next = now + self.mean.mul_f64(self.rng.random_range(0.5..1.5));
        if self.deck.is_empty() {
            self.deck = self.kinds.clone();
            self.deck.shuffle(&mut self.rng);
        }
        self.deck.pop()
    }

    /// A random duration in `range` milliseconds.
    pub fn millis(&mut self, range: Range<u64>) -> Duration {
        Duration::from_millis(self.rng.random_range(range))
    }

    /// Counts one fault of `kind` as injected.
    pub fn injected(&mut self, kind: K) {
        *self.counts.entry(kind).or_insert(0) += 1;
    }

    /// Faults injected in all.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}
