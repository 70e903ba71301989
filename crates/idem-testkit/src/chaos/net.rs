//! Network faults at the fault proxies, applied on a link and lifted when
//! their time is over.

use std::ops::Range;
use std::time::{Duration, Instant};

use rand::Rng;

use super::fault::{Fault, Link};
use super::schedule::Schedule;
use crate::doubles::proxy::FaultProxy;

/// The network faults in force, and when each ends.
#[derive(Debug)]
pub(super) struct NetFaults {
    timed: Vec<(Instant, Fault)>,
    /// How many bytes of an answer get through before a `cut`.
    cut_after: Range<usize>,
}

impl NetFaults {
    /// `cut` faults let `cut_after` bytes through, then reset.
    pub(super) fn new(cut_after: Range<usize>) -> Self {
        Self {
            timed: Vec::new(),
            cut_after,
        }
    }

    /// Applies network fault `kind` at every proxy on its link, with its
    /// details drawn from `schedule`; `false` if there is none.
    pub(super) fn apply(
        &mut self,
        kind: Fault,
        now: Instant,
        schedule: &mut Schedule<Fault>,
        proxies: &[&FaultProxy],
    ) -> bool {
        if proxies.is_empty() {
            return false;
        }
        match kind {
            Fault::Latency(_) => {
                let (delay, end) = (schedule.millis(5..60), schedule.millis(300..1500));
                proxies.iter().for_each(|p| p.set_delay(delay));
                self.timed.push((now + end, kind));
            }
            Fault::Blackhole(_) => {
                let end = schedule.millis(300..1500);
                proxies.iter().for_each(|p| p.set_blackhole(true));
                self.timed.push((now + end, kind));
            }
            Fault::Reset(_) => proxies.iter().for_each(|p| p.reset_all()),
            Fault::Cut(_) => {
                let bytes = schedule.rng.random_range(self.cut_after.clone());
                let end = schedule.millis(100..500);
                proxies.iter().for_each(|p| p.set_cut_after(Some(bytes)));
                self.timed.push((now + end, kind));
            }
            _ => return false,
        }
        true
    }

    /// Lifts the faults whose time is over, at the proxies `on` gives for
    /// each link.
    pub(super) fn lift_due<'a>(&mut self, now: Instant, on: impl Fn(Link) -> Vec<&'a FaultProxy>) {
        let (over, left): (Vec<_>, Vec<_>) = self.timed.iter().partition(|(end, _)| now >= *end);
        self.timed = left;
        for (_, kind) in over {
            let Some(link) = kind.link() else { continue };
            for proxy in on(link) {
                match kind {
                    Fault::Latency(_) => proxy.set_delay(Duration::ZERO),
                    Fault::Blackhole(_) => proxy.set_blackhole(false),
                    Fault::Cut(_) => proxy.set_cut_after(None),
                    _ => {}
                }
            }
        }
    }

    /// Lifts every fault on every link.
    pub(super) fn heal<'a>(&mut self, on: impl Fn(Link) -> Vec<&'a FaultProxy>) {
        self.timed.clear();
        for link in [Link::Idem, Link::Broker] {
            on(link).into_iter().for_each(FaultProxy::heal);
        }
    }
}
