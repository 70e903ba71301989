//! What every run's fault injector shares: when the next fault comes and
//! which kind it is ([`Schedule`]), and the fault proxy's faults, applied
//! and lifted when their time is over ([`ProxyFaults`]). Each run injects
//! its own process faults (workers, stores, the gateway) itself.

use std::ops::Range;
use std::time::{Duration, Instant};

use idem_testkit::doubles::proxy::FaultProxy;
use rand::Rng;

use crate::FaultKind;

/// The fault schedule of these runs.
pub(crate) type Schedule = idem_testkit::chaos::faults::Schedule<FaultKind>;

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
