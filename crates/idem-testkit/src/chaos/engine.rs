//! The engine every fault-injection run shares: it steps a [`Target`],
//! deals faults from a seeded [`Schedule`], applies the network ones at
//! the target's fault proxies itself and has the target inject the rest,
//! continues stopped processes when their time is up, heals everything
//! when the fault phase ends, waits for the target to settle and has it
//! judge. The targets (the `idem-chaos` binary's workers against a store
//! and its HTTP gateway run, and the broker adapters' consumers) bring
//! their processes, their workload and their checker.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::ops::Range;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;

use super::fault::{Fault, Link};
use super::net::NetFaults;
use super::report::{Findings, Report, Violation};
use super::schedule::Schedule;
use crate::doubles::proxy::FaultProxy;

/// When and what a run injects, whatever its target.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// Seeds every fault: the same seed injects the same faults at the
    /// same offsets (what they hit depends on timing).
    pub seed: u64,
    /// Which faults to inject (those the target cannot are left out).
    pub faults: Vec<Fault>,
    /// The mean time between faults.
    pub fault_every: Duration,
    /// How long faults are injected (and the workload published).
    pub duration: Duration,
    /// How long the run may take to settle after the fault phase before
    /// what is unsettled counts as lost.
    pub settle_limit: Duration,
}

/// Where a run is in time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// When the fault phase began.
    pub start: Instant,
    /// Now.
    pub now: Instant,
    /// When the fault phase ends.
    pub fault_end: Instant,
}

impl Clock {
    /// Whether faults are still being injected.
    pub fn faulting(&self) -> bool {
        self.now < self.fault_end
    }

    /// The share of the fault phase gone by, in `[0, 1]`: how much of a
    /// workload published at an even pace is due.
    pub fn share(&self) -> f64 {
        let phase = self.fault_end.duration_since(self.start).as_secs_f64();
        if phase <= 0.0 {
            return 1.0;
        }
        (self.now.duration_since(self.start).as_secs_f64() / phase).min(1.0)
    }
}

/// What became of a fault the engine asked a target to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// It was injected.
    Done,
    /// Process `pid` was stopped (SIGSTOP); the engine has the target
    /// continue it at `until`, or when the fault phase ends.
    Stopped {
        /// The stopped process.
        pid: u32,
        /// When to continue it.
        until: Instant,
    },
    /// It could not be injected now (no worker busy, the gateway down):
    /// the schedule deals it again in its next round.
    Missed,
    /// Another fault of the servers is still under way: the engine tries
    /// it again once that one has ended, even after the fault phase.
    Busy,
}

/// Where a run is, for a progress display.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Work done (deliveries acknowledged, requests answered).
    pub done: usize,
    /// Work in all.
    pub total: usize,
    /// Faults injected so far.
    pub faults: u64,
    /// Whether faults are still being injected.
    pub faulting: bool,
}

/// What a fault-injection run exercises: its processes, its workload and
/// its checker. The engine ([`run`]) drives it.
pub trait Target {
    /// Why the run could not be carried out (not a violation it found).
    type Error;

    /// Its name in reports.
    fn name(&self) -> String;

    /// The faults it can inject: network faults on links it has proxies
    /// on, and the kinds its [`Target::inject`] carries out.
    fn faults(&self) -> Vec<Fault>;

    /// The fault proxies on `link` (none if it has no such link).
    fn proxies(&self, link: Link) -> Vec<&FaultProxy>;

    /// How many bytes of an answer a `cut` lets through before it resets
    /// the connection.
    fn cut_after(&self) -> Range<usize> {
        1..64
    }

    /// Starts its processes.
    fn start(&mut self) -> impl Future<Output = Result<(), Self::Error>>;

    /// Waits a short tick for something to happen, then takes what its
    /// processes said, replaces those that exited, publishes the share of
    /// the workload due at `clock` and hands out work.
    fn step(&mut self, clock: &Clock) -> impl Future<Output = Result<(), Self::Error>>;

    /// Injects `fault` (any but a network fault), its details drawn from
    /// `rng`.
    fn inject(
        &mut self,
        fault: Fault,
        clock: &Clock,
        rng: &mut StdRng,
    ) -> impl Future<Output = Result<Injected, Self::Error>>;

    /// Continues process `pid`, stopped by [`Injected::Stopped`], if it is
    /// still one of the target's.
    fn resume(&mut self, pid: u32);

    /// Work done and work in all.
    fn progress(&self) -> (usize, usize);

    /// Whether the workload is still being published after the fault
    /// phase (a broker slower than the schedule): the settle limit counts
    /// from when it is done, and publishing may overrun the fault phase by
    /// one settle limit at most. `false` by default: the workload is out
    /// when the fault phase ends.
    fn publishing(&self) -> bool {
        false
    }

    /// Whether all the work is done and nothing is under way (asked after
    /// the fault phase, once every fault has been healed).
    fn settled(&mut self) -> impl Future<Output = bool>;

    /// What was left undone when the settle limit passed.
    fn unsettled(&self, clock: &Clock, limit: Duration) -> Vec<Violation>;

    /// Stops its processes and judges what they left behind.
    fn finish(&mut self) -> impl Future<Output = Result<Findings, Self::Error>>;
}

/// Runs `target` under the faults of `plan` and has it judge the
/// outcome; `progress` is called a few times a second.
pub async fn run<T: Target>(
    plan: &FaultPlan,
    target: &mut T,
    progress: impl Fn(Progress),
) -> Result<Report, T::Error> {
    let can = target.faults();
    let kinds: Vec<Fault> = plan
        .faults
        .iter()
        .copied()
        .filter(|k| can.contains(k))
        .collect();
    target.start().await?;
    let start = Instant::now();
    let mut faults = Faults {
        schedule: Schedule::new(
            plan.seed ^ 0x6661_756c_7473,
            kinds.clone(),
            plan.fault_every,
            start,
        ),
        net: NetFaults::new(target.cut_after()),
        stopped: Vec::new(),
        deferred: VecDeque::new(),
        healed: false,
    };
    let fault_end = start + plan.duration;
    let mut settle_from: Option<Instant> = None;
    let mut shown = start;
    let mut late = Vec::new();
    loop {
        let clock = Clock {
            start,
            now: Instant::now(),
            fault_end,
        };
        target.step(&clock).await?;
        let clock = Clock {
            now: Instant::now(),
            ..clock
        };
        faults.step(target, &clock).await?;
        if clock.now.duration_since(shown) > Duration::from_millis(250) {
            shown = clock.now;
            let (done, total) = target.progress();
            progress(Progress {
                done,
                total,
                faults: faults.schedule.total(),
                faulting: clock.faulting(),
            });
        }
        if !clock.faulting() && settle_from.is_none() && !target.publishing() {
            settle_from = Some(clock.now);
        }
        if settle_from.is_some() && faults.deferred.is_empty() && target.settled().await {
            break;
        }
        let limit = settle_from.unwrap_or(fault_end + plan.settle_limit) + plan.settle_limit;
        if clock.now >= limit {
            late = target.unsettled(&clock, plan.settle_limit);
            break;
        }
    }
    let elapsed = start.elapsed();
    let mut findings = target.finish().await?;
    findings.violations.splice(0..0, late);
    let mut counts: BTreeMap<Fault, u64> = kinds.into_iter().map(|k| (k, 0)).collect();
    counts.extend(faults.schedule.counts);
    Ok(Report {
        target: target.name(),
        seed: plan.seed,
        faults: counts,
        elapsed,
        findings,
    })
}

/// The schedule and the faults in force.
struct Faults {
    schedule: Schedule<Fault>,
    net: NetFaults,
    /// Stopped processes, and when each is continued.
    stopped: Vec<(Instant, u32)>,
    /// Faults a target was busy for, each kind once, those never injected
    /// yet first: tried again as the one under way ends, even after the
    /// fault phase, so a slow failover does not crowd the others out.
    deferred: VecDeque<Fault>,
    healed: bool,
}

impl Faults {
    /// Lifts what is due, heals everything once the fault phase is over,
    /// and injects the fault due now or else a deferred one.
    async fn step<T: Target>(&mut self, target: &mut T, clock: &Clock) -> Result<(), T::Error> {
        self.net.lift_due(clock.now, |link| target.proxies(link));
        let (due, left): (Vec<_>, Vec<_>) = self
            .stopped
            .iter()
            .partition(|(until, _)| clock.now >= *until || !clock.faulting());
        self.stopped = left;
        for (_, pid) in due {
            target.resume(pid);
        }
        let dealt = if clock.faulting() {
            self.schedule.due(clock.now)
        } else {
            if !self.healed {
                self.healed = true;
                self.net.heal(|link| target.proxies(link));
            }
            None
        };
        match dealt {
            Some(kind) => self.inject(target, kind, clock, true).await,
            None => match self.deferred.front() {
                Some(&kind) => self.inject(target, kind, clock, false).await,
                None => Ok(()),
            },
        }
    }

    async fn inject<T: Target>(
        &mut self,
        target: &mut T,
        kind: Fault,
        clock: &Clock,
        fresh: bool,
    ) -> Result<(), T::Error> {
        let outcome = match kind.link() {
            Some(link) => {
                let proxies = target.proxies(link);
                if self
                    .net
                    .apply(kind, clock.now, &mut self.schedule, &proxies)
                {
                    Injected::Done
                } else {
                    Injected::Missed
                }
            }
            None => target.inject(kind, clock, &mut self.schedule.rng).await?,
        };
        if outcome != Injected::Busy {
            self.deferred.retain(|k| *k != kind);
        }
        match outcome {
            Injected::Done => self.schedule.injected(kind),
            Injected::Stopped { pid, until } => {
                self.stopped.push((until, pid));
                self.schedule.injected(kind);
            }
            Injected::Missed if fresh => self.schedule.missed(kind),
            Injected::Missed => {}
            Injected::Busy if self.deferred.contains(&kind) => {}
            Injected::Busy if self.schedule.counts.contains_key(&kind) => {
                self.deferred.push_back(kind);
            }
            Injected::Busy => self.deferred.push_front(kind),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target of pure bookkeeping: a store fault keeps it busy for a
    /// while, a stop holds process 7 for an hour, and it has settled once
    /// 7 runs again and nothing is under way.
    #[derive(Default)]
    struct Bookkeeping {
        injected: Vec<Fault>,
        busy_until: Option<Instant>,
        stopped: bool,
        resumed_after_faults: bool,
        fault_end: Option<Instant>,
        never_settles: bool,
        /// Store faults injected after the fault phase.
        after_phase: usize,
    }

    impl Target for Bookkeeping {
        type Error = std::convert::Infallible;

        fn name(&self) -> String {
            "bookkeeping".into()
        }

        fn faults(&self) -> Vec<Fault> {
            vec![Fault::Stop, Fault::StoreRestart, Fault::Migrate]
        }

        fn proxies(&self, _link: Link) -> Vec<&FaultProxy> {
            Vec::new()
        }

        async fn start(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }

        async fn step(&mut self, clock: &Clock) -> Result<(), Self::Error> {
            self.fault_end = Some(clock.fault_end);
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(())
        }

        async fn inject(
            &mut self,
            fault: Fault,
            clock: &Clock,
            _rng: &mut StdRng,
        ) -> Result<Injected, Self::Error> {
            if fault == Fault::Stop {
                self.stopped = true;
                self.injected.push(fault);
                return Ok(Injected::Stopped {
                    pid: 7,
                    until: clock.now + Duration::from_secs(3600),
                });
            }
            if self.busy_until.is_some_and(|until| clock.now < until) {
                return Ok(Injected::Busy);
            }
            self.busy_until = Some(clock.now + Duration::from_millis(150));
            self.injected.push(fault);
            if !clock.faulting() {
                self.after_phase += 1;
            }
            Ok(Injected::Done)
        }

        fn resume(&mut self, pid: u32) {
            assert_eq!(pid, 7);
            self.stopped = false;
            self.resumed_after_faults = self.fault_end.is_some_and(|end| Instant::now() >= end);
        }

        fn progress(&self) -> (usize, usize) {
            (0, 0)
        }

        async fn settled(&mut self) -> bool {
            let idle = self.busy_until.is_none_or(|until| Instant::now() >= until);
            !self.never_settles && !self.stopped && idle
        }

        fn unsettled(&self, _clock: &Clock, limit: Duration) -> Vec<Violation> {
            vec![Violation::run(format!("unsettled after {limit:?}"))]
        }

        async fn finish(&mut self) -> Result<Findings, Self::Error> {
            Ok(Findings {
                keys: 1,
                counts: vec![("injected", self.injected.len() as u64)],
                ..Findings::default()
            })
        }
    }

    fn plan(faults: Vec<Fault>) -> FaultPlan {
        FaultPlan {
            seed: 3,
            faults,
            fault_every: Duration::from_millis(20),
            duration: Duration::from_millis(300),
            settle_limit: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn busy_faults_wait_their_turn_stopped_processes_resume_and_the_report_counts() {
        let mut target = Bookkeeping::default();
        let faults = vec![
            Fault::Stop,
            Fault::StoreRestart,
            Fault::Migrate,
            Fault::Leave,
        ];
        let report = run(&plan(faults), &mut target, |_| {})
            .await
            .expect("infallible");
        assert!(report.violations().is_empty(), "{report:?}");
        // Store faults overlap (one every 20 ms, each busy for 150 ms), so
        // most come due while another is under way: those are injected as
        // the one under way ends, after the fault phase too (the schedule
        // deals nothing then).
        assert!(target.after_phase >= 1, "{report:?}");
        assert!(report.faults_of(Fault::StoreRestart) >= 1, "{report:?}");
        assert!(report.faults_of(Fault::Migrate) >= 1, "{report:?}");
        assert_eq!(
            report.count("injected"),
            report.faults.values().sum::<u64>(),
            "{report:?}"
        );
        // The hour-long stop was lifted when the fault phase ended.
        assert!(target.resumed_after_faults && !target.stopped);
        // A kind the target cannot inject is left out, not counted.
        assert!(!report.faults.contains_key(&Fault::Leave), "{report:?}");
    }

    #[tokio::test]
    async fn a_run_that_never_settles_ends_at_the_limit_with_the_targets_account() {
        let mut target = Bookkeeping {
            never_settles: true,
            ..Bookkeeping::default()
        };
        let mut plan = plan(vec![Fault::StoreRestart]);
        plan.settle_limit = Duration::from_millis(100);
        let report = run(&plan, &mut target, |_| {}).await.expect("infallible");
        assert_eq!(report.violations().len(), 1, "{report:?}");
        assert!(report.violations()[0].what.contains("unsettled after"));
    }
}
