//! The worker run as the fault engine's [target](chaos::Target): what a
//! step does, how each fault is injected, when the run has settled, and
//! the evidence it is judged on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use idem_testkit::chaos::{self, Clock, Fault, Findings, Injected, Link};
use idem_testkit::doubles::proxy::FaultProxy;
use idem_testkit::ServerError;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::task::JoinHandle;

use super::Broker;
use crate::check::Violation;
use crate::error::{harness, ChaosError};
use crate::evidence::collect_evidence;
use crate::servers::Servers;
use crate::Target;

impl Broker {
    /// Starts store fault `start` unless one is under way.
    fn store_fault(
        &mut self,
        start: impl FnOnce(&Servers) -> Option<JoinHandle<Result<(), ServerError>>>,
    ) -> Injected {
        if self.store_fault.is_some() {
            return Injected::Busy;
        }
        self.store_fault = self.servers.as_ref().and_then(start);
        if self.store_fault.is_some() {
            Injected::Done
        } else {
            Injected::Missed
        }
    }
}

impl chaos::Target for Broker {
    type Error = ChaosError;

    fn name(&self) -> String {
        self.target.name().to_owned()
    }

    fn faults(&self) -> Vec<Fault> {
        self.target.faults()
    }

    fn proxies(&self, link: Link) -> Vec<&FaultProxy> {
        match (link, &self.servers) {
            (Link::Idem, Some(servers)) => servers.proxies.iter().collect(),
            _ => Vec::new(),
        }
    }

    async fn start(&mut self) -> Result<(), ChaosError> {
        for slot in 0..self.workers.len() {
            self.spawn(slot)?;
        }
        Ok(())
    }

    async fn step(&mut self, clock: &Clock) -> Result<(), ChaosError> {
        let tick = self
            .tick
            .get_or_insert_with(|| tokio::time::interval(Duration::from_millis(5)));
        let event = tokio::select! {
            Some(event) = self.events.recv() => Some(event),
            _ = tick.tick() => None,
        };
        if let Some(event) = event {
            self.handle(event, Instant::now())?;
        }
        let now = Instant::now();
        // Publish at an even pace over the fault phase.
        let total = self.deliveries.len();
        let due = ((total as f64) * clock.share()) as usize;
        let due = if clock.faulting() {
            due.min(total)
        } else {
            total
        };
        while self.published < due {
            self.queue(now, self.published);
            self.published += 1;
        }
        if self
            .store_fault
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
        {
            if let Some(handle) = self.store_fault.take() {
                handle
                    .await
                    .map_err(harness)?
                    .map_err(|source| ChaosError::Server {
                        what: "a store fault (restart, failover, slot move or lock hold)",
                        source,
                    })?;
            }
        }
        self.dispatch(now, self.inflight).await;
        Ok(())
    }

    async fn inject(
        &mut self,
        fault: Fault,
        clock: &Clock,
        rng: &mut StdRng,
    ) -> Result<Injected, ChaosError> {
        let lease = self.config.lease;
        Ok(match fault {
            Fault::Kill => match self.busy_slot(rng.random_range(0..usize::MAX)) {
                Some(slot) => {
                    self.kill(slot, clock.now).await?;
                    Injected::Done
                }
                None => Injected::Missed,
            },
            Fault::Stop => match self.busy_slot(rng.random_range(0..usize::MAX)) {
                Some(slot) => {
                    let until = clock.now + lease.mul_f64(rng.random_range(1.5..3.0));
                    self.signal(slot, Signal::SIGSTOP);
                    match self.workers[slot].as_mut() {
                        Some(w) => {
                            w.stopped = true;
                            Injected::Stopped {
                                pid: w.pid.as_raw().unsigned_abs(),
                                until,
                            }
                        }
                        None => Injected::Missed,
                    }
                }
                None => Injected::Missed,
            },
            Fault::Clock if self.target.reads_worker_clock() => {
                match self.busy_slot(rng.random_range(0..usize::MAX)) {
                    Some(slot) => {
                        let jump = lease.mul_f64(rng.random_range(1.5..3.0));
                        let ms = i64::try_from(jump.as_millis()).unwrap_or(i64::MAX);
                        let ms = if rng.random_bool(0.5) { ms } else { -ms };
                        self.tell(slot, &format!("C {ms}\n")).await;
                        Injected::Done
                    }
                    None => Injected::Missed,
                }
            }
            Fault::StoreRestart if self.target == Target::SqliteLease => {
                self.kill_all(clock.now).await?;
                Injected::Done
            }
            Fault::StoreRestart if self.store_fault.is_none() => {
                let down = Duration::from_millis(rng.random_range(100..800));
                self.store_fault(|servers| Some(servers.restart_store(down)))
            }
            Fault::Migrate if self.store_fault.is_none() => {
                let (slots, pick) = (rng.random_range(20..200), rng.random_range(0..usize::MAX));
                self.store_fault(|servers| servers.migrate(slots, pick))
            }
            Fault::Locks if self.store_fault.is_none() => {
                let hold = Duration::from_millis(rng.random_range(100..600));
                self.store_fault(|servers| Some(servers.hold_locks(hold)))
            }
            Fault::StoreRestart | Fault::Migrate | Fault::Locks => Injected::Busy,
            _ => Injected::Missed,
        })
    }

    fn resume(&mut self, pid: u32) {
        let slot = self.workers.iter().position(|w| {
            w.as_ref()
                .is_some_and(|w| w.stopped && w.pid.as_raw().unsigned_abs() == pid)
        });
        if let Some(slot) = slot {
            self.signal(slot, Signal::SIGCONT);
            if let Some(w) = self.workers[slot].as_mut() {
                w.stopped = false;
            }
        }
    }

    fn progress(&self) -> (usize, usize) {
        (self.acked, self.deliveries.len())
    }

    async fn settled(&mut self) -> bool {
        self.acked == self.deliveries.len() && self.store_fault.is_none()
    }

    fn unsettled(&self, clock: &Clock, limit: Duration) -> Vec<Violation> {
        let missing: BTreeSet<&str> = self
            .deliveries
            .iter()
            .filter(|d| !d.acked)
            .map(|d| self.keys[d.key].as_str())
            .collect();
        let mut violations = vec![Violation::run(format!(
            "{} keys never acknowledged within {limit:?} of the faults ending: {:?}",
            missing.len(),
            missing.iter().take(10).collect::<Vec<_>>()
        ))];
        for (id, d) in self
            .deliveries
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.acked)
            .take(5)
        {
            let whereabouts = match d.holder {
                Some((slot, since)) => format!(
                    "held by worker {slot} for {:.1}s",
                    clock.now.duration_since(since).as_secs_f64()
                ),
                None if d.queued.is_some() => "queued".to_owned(),
                None => "neither held nor queued".to_owned(),
            };
            violations.push(Violation::key(
                self.keys[d.key].clone(),
                format!(
                    "delivery {id} unacknowledged: handed out {} times, {whereabouts}",
                    d.attempt
                ),
            ));
        }
        violations
    }

    async fn finish(&mut self) -> Result<Findings, ChaosError> {
        if let Some(handle) = self.store_fault.take() {
            let _ = handle.await;
        }
        self.stop_workers().await;
        let mut tally = std::mem::take(&mut self.tally);
        tally.violations.append(&mut self.crashes);
        if self.unguarded > 0 {
            tally.violations.push(Violation::run(format!(
                "{} deliveries ran unguarded (the executor must fail closed)",
                self.unguarded
            )));
        }
        let servers = self
            .servers
            .as_ref()
            .ok_or_else(|| harness("the run's servers are gone"))?;
        collect_evidence(self.target, servers, &self.dir, &self.keys, &mut tally).await?;
        Ok(tally.into_findings(self.keys.len()))
    }
}
