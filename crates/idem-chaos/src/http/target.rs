//! The HTTP run as the fault engine's [target](chaos::Target): what a step
//! does, how the gateway is killed, when the run has settled, and the
//! check it is judged by.

use std::time::{Duration, Instant};

use idem_cli::store::StoreUrl;
use idem_testkit::chaos::{self, Clock, Fault, Findings, Injected, Link};
use idem_testkit::doubles::proxy::FaultProxy;
use rand::rngs::StdRng;
use rand::Rng;

use super::Run;
use crate::check::Violation;
use crate::error::{harness, ChaosError};

impl chaos::Target for Run {
    type Error = ChaosError;

    fn name(&self) -> String {
        self.target.name().to_owned()
    }

    fn faults(&self) -> Vec<Fault> {
        self.target.faults()
    }

    fn proxies(&self, link: Link) -> Vec<&FaultProxy> {
        match link {
            Link::Idem => vec![&self.proxy],
            Link::Broker => Vec::new(),
        }
    }

    /// Up to 200 bytes: some cuts fall in the head, some in the body.
    fn cut_after(&self) -> std::ops::Range<usize> {
        1..200
    }

    async fn start(&mut self) -> Result<(), ChaosError> {
        self.start_gateway().await?;
        let store = self
            .store_url
            .parse::<StoreUrl>()
            .map_err(harness)?
            .open()
            .await
            .map_err(harness)?;
        self.store = Some(store);
        let entry = format!("http://{}", self.proxy.addr());
        self.spawn_clients(self.workers, &entry)
    }

    async fn step(&mut self, clock: &Clock) -> Result<(), ChaosError> {
        let tick = self
            .tick
            .get_or_insert_with(|| tokio::time::interval(Duration::from_millis(5)));
        let said = tokio::select! {
            Some(said) = self.events.recv() => Some(said),
            _ = tick.tick() => None,
        };
        if let Some((slot, line)) = said {
            self.take(slot, line);
        }
        let now = Instant::now();
        let total = self.jobs.len();
        let due = ((total as f64) * clock.share()) as usize;
        let due = if clock.faulting() {
            due.min(total)
        } else {
            total
        };
        while self.published < due {
            self.pending.push_back(self.published);
            self.published += 1;
        }
        self.watch_gateway().await?;
        if self
            .restart_at
            .is_some_and(|at| now >= at || !clock.faulting())
        {
            self.restart_at = None;
            let store = self.store.take().ok_or_else(|| harness("no store open"))?;
            let noted = self.note_in_progress(&store).await;
            self.store = Some(store);
            noted?;
            self.start_gateway().await?;
        }
        self.dispatch(self.inflight).await;
        // Every workload request answered: after a lease, so claims a
        // dead gateway left have run out, every key gets one more.
        if !clock.faulting() && self.answered == total && self.gateway.is_some() {
            match self.settling_from {
                None => self.settling_from = Some(now + self.lease + Duration::from_millis(300)),
                Some(at) if now >= at && self.published == total => {
                    self.pending.extend(total..total + self.keys.len());
                    self.published += self.keys.len();
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn inject(
        &mut self,
        fault: Fault,
        clock: &Clock,
        rng: &mut StdRng,
    ) -> Result<Injected, ChaosError> {
        if fault != Fault::Kill || self.gateway.is_none() {
            return Ok(Injected::Missed);
        }
        let down = Duration::from_millis(rng.random_range(100..500));
        let store = self.store.take().ok_or_else(|| harness("no store open"))?;
        let killed = self.kill_gateway(&store).await;
        self.store = Some(store);
        killed?;
        self.restart_at = Some(clock.now + down);
        Ok(Injected::Done)
    }

    fn resume(&mut self, _pid: u32) {}

    fn progress(&self) -> (usize, usize) {
        (self.answered, self.jobs.len() + self.keys.len())
    }

    async fn settled(&mut self) -> bool {
        self.answered == self.jobs.len() + self.keys.len()
    }

    fn unsettled(&self, _clock: &Clock, limit: Duration) -> Vec<Violation> {
        let total = self.jobs.len() + self.keys.len();
        vec![Violation::run(format!(
            "{} of {total} requests never answered within {limit:?} of the faults ending",
            total - self.answered,
        ))]
    }

    async fn finish(&mut self) -> Result<Findings, ChaosError> {
        self.stop().await;
        Ok(self.check().await?.into_findings(self.keys.len()))
    }
}
