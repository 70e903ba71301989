//! A seeded fault schedule for fault-injection runs: when the next fault
//! comes and which kind it is. Each round deals every kind once, in a
//! seeded order, so even a short run sees them all; a kind that could not
//! be injected when dealt is dealt again in the next round. The same seed
//! gives the same faults at the same offsets.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Seeded fault times and kinds: each round injects every kind once, in a
/// seeded order, so even a short run sees them all.
#[derive(Debug)]
pub struct Schedule<K> {
    /// The fault stream's own random numbers, also for each fault's
    /// details, so the workload's shape does not move the faults.
    pub rng: StdRng,
    kinds: Vec<K>,
    deck: Vec<K>,
    /// Kinds dealt but not injected, dealt again in the next round.
    owed: Vec<K>,
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
            owed: Vec::new(),
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
            self.deck.append(&mut self.owed);
            self.deck.shuffle(&mut self.rng);
        }
        self.deck.pop()
    }

    /// Notes that `kind`, dealt by [`Schedule::due`], could not be
    /// injected (no worker busy, another store fault under way): the next
    /// round deals it once more besides its own turn. A kind that can
    /// never be injected is owed once, not once per round.
    pub fn missed(&mut self, kind: K) {
        if !self.owed.contains(&kind) {
            self.owed.push(kind);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Deals every fault due over `rounds` rounds, `missing` never injected.
    fn deal(schedule: &mut Schedule<u8>, rounds: usize, missing: u8) -> Vec<u8> {
        let mut now = Instant::now();
        let mut dealt = Vec::new();
        while dealt.len() < rounds {
            now += Duration::from_secs(2);
            if let Some(kind) = schedule.due(now) {
                if kind == missing {
                    schedule.missed(kind);
                } else {
                    schedule.injected(kind);
                }
                dealt.push(kind);
            }
        }
        dealt
    }

    #[test]
    fn every_round_deals_every_kind_and_a_missed_one_again() {
        let mut schedule = Schedule::new(7, vec![1, 2, 3], Duration::from_secs(1), Instant::now());
        let dealt = deal(&mut schedule, 3 + 4 + 4, 2);
        for round in [&dealt[0..3], &dealt[3..7], &dealt[7..11]] {
            for kind in [1, 3] {
                assert_eq!(round.iter().filter(|k| **k == kind).count(), 1, "{dealt:?}");
            }
        }
        // Kind 2 was dealt in the first round, missed, and so dealt twice
        // in every later one: owed once, not once per round.
        assert_eq!(
            dealt[3..7].iter().filter(|k| **k == 2).count(),
            2,
            "{dealt:?}"
        );
        assert_eq!(
            dealt[7..11].iter().filter(|k| **k == 2).count(),
            2,
            "{dealt:?}"
        );
        assert_eq!(schedule.counts.get(&2), None);
        assert_eq!(schedule.total(), 6);
    }
}
