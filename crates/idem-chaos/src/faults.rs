//! What every run's fault injector shares: when the next fault comes and
//! which kind it is ([`Schedule`]), and the fault proxy's faults, applied
//! and lifted when their time is over ([`ProxyFaults`]). Each run injects
//! its own process faults (workers, stores, the gateway) itself.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use idem_testkit::proxy::FaultProxy;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::FaultKind;

/// Seeded fault times and kinds: each round injects every kind once, in a
/// seeded order, so even a short run sees them all.
pub(crate) struct Schedule {
    /// The fault stream's own random numbers, also for each fault's
    /// details, so the workload's shape does not move the faults.
    pub(crate) rng: StdRng,
    kinds: Vec<FaultKind>,
    deck: Vec<FaultKind>,
    next: Instant,
    mean: Duration,
    /// Faults injected so far, by kind.
    pub(crate) counts: BTreeMap<FaultKind, u64>,
}

impl Schedule {
    /// Faults of `kinds`, about `mean` apart from `start` on, seeded by
    /// `seed`.
    pub(crate) fn new(seed: u64, kinds: Vec<FaultKind>, mean: Duration, start: Instant) -> Self {
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
    pub(crate) fn due(&mut self, now: Instant) -> Option<FaultKind> {
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
    pub(crate) fn millis(&mut self, range: Range<u64>) -> Duration {
        Duration::from_millis(self.rng.random_range(range))
    }

    /// Counts one fault of `kind` as injected.
    pub(crate) fn injected(&mut self, kind: FaultKind) {
        *self.counts.entry(kind).or_insert(0) += 1;
    }

    /// Faults injected in all.
    pub(crate) fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// The fault proxy's faults in force, and when each ends.
pub(crate) struct ProxyFaults {
    timed: Vec<(Instant, FaultKind)>,
    /// How many bytes of an answer get through before a `cut`.
    cut_after: Range<usize>,
}

impl ProxyFaults {
    /// `cut` faults let `cut_after` bytes through, then reset.
    pub(crate) fn new(cut_after: Range<usize>) -> Self {
        Self {
            timed: Vec::new(),
            cut_after,
        }
    }

    /// Lifts the faults whose time is over.
    pub(crate) fn lift_due(&mut self, now: Instant, proxies: &[FaultProxy]) {
        let (over, left): (Vec<_>, Vec<_>) = self.timed.iter().partition(|(end, _)| now >= *end);
        self.timed = left;
        for (_, kind) in over {
            for proxy in proxies {
                match kind {
                    FaultKind::Latency => proxy.set_delay(Duration::ZERO),
                    FaultKind::Blackhole => proxy.set_blackhole(false),
                    FaultKind::Cut => proxy.set_cut_after(None),
                    _ => {}
                }
            }
        }
    }

    /// Applies `kind` at every proxy (the network between the workers and
    /// the store), with its details drawn from `schedule`; `false` if
    /// `kind` is not a proxy fault.
    pub(crate) fn apply(
        &mut self,
        kind: FaultKind,
        now: Instant,
        schedule: &mut Schedule,
        proxies: &[FaultProxy],
    ) -> bool {
        match kind {
            FaultKind::Latency => {
                let (delay, end) = (schedule.millis(5..60), schedule.millis(300..1500));
                proxies.iter().for_each(|p| p.set_delay(delay));
                self.timed.push((now + end, kind));
            }
            FaultKind::Blackhole => {
                let end = schedule.millis(300..1500);
                proxies.iter().for_each(|p| p.set_blackhole(true));
                self.timed.push((now + end, kind));
            }
            FaultKind::Reset => proxies.iter().for_each(FaultProxy::reset_all),
            FaultKind::Cut => {
                let bytes = schedule.rng.random_range(self.cut_after.clone());
                let end = schedule.millis(100..500);
                proxies.iter().for_each(|p| p.set_cut_after(Some(bytes)));
                self.timed.push((now + end, kind));
            }
            _ => return false,
        }
        true
    }

    /// Lifts every fault.
    pub(crate) fn heal(&mut self, proxies: &[FaultProxy]) {
        self.timed.clear();
        proxies.iter().for_each(FaultProxy::heal);
    }
}
