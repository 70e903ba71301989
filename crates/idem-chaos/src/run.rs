//! A run: the fault proxy, worker processes, the broker that feeds them
//! and the fault injector, between starting the servers
//! ([`crate::servers`]) and gathering the evidence for the checker
//! ([`crate::evidence`]).

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idem_sqlite::SqliteStore;
use idem_testkit::ServerError;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::check::{Report, Violation};
use crate::error::{harness, ChaosError};
use crate::evidence::collect_evidence;
use crate::faults::{ProxyFaults, Schedule};
use crate::servers::{sqlite_file, Servers};
use crate::worker::WorkerConfig;
use crate::{FaultKind, Plan, Target};

/// Where a run is, for a progress display.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Deliveries acknowledged.
    pub acked: usize,
    /// Deliveries in all.
    pub deliveries: usize,
    /// Faults injected so far.
    pub faults: u64,
    /// Whether faults are still being injected.
    pub faulting: bool,
}

/// Runs `plan` and checks it; `progress` is called a few times a second.
pub async fn run(plan: &Plan, progress: impl Fn(Progress)) -> Result<Report, ChaosError> {
    validate(plan)?;
    let servers = Servers::start(plan.target, plan.redis_append_only, plan.replica_acks).await?;
    let dir = tempfile_dir()?;
    if plan.target == Target::SqliteLease {
        // Created and migrated before the workers open it.
        let file = sqlite_file(&dir);
        tokio::task::spawn_blocking(move || SqliteStore::open(file).map(drop))
            .await
            .map_err(harness)?
            .map_err(|e| harness(format!("creating the SQLite store: {e}")))?;
    }
    let (store_url, downstream_url) = servers.worker_urls(&dir);
    let config = WorkerConfig {
        target: plan.target,
        store_url,
        downstream_url,
        lease: plan.lease,
        inflight: plan.inflight,
        ledger_dir: dir.clone(),
    };
    let mut broker = Broker::new(plan, config, dir.clone());
    let outcome = broker.drive(plan, &servers, &progress).await;
    broker.stop_workers().await;
    let mut report = outcome?;
    collect_evidence(plan, &servers, &dir, &broker.keys, &mut report).await?;
    if report.violations.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        report.violations.push(Violation {
            key: None,
            what: format!("ledgers and worker logs kept in {}", dir.display()),
        });
        report.kept = Some(dir);
    }
    Ok(report)
}

fn validate(plan: &Plan) -> Result<(), ChaosError> {
    let bad = |why: &str| Err(ChaosError::Plan(why.to_owned()));
    if plan.target.is_http() {
        return bad("HTTP targets are run by idem_chaos::http::run");
    }
    if plan.keys == 0 || plan.workers == 0 || plan.inflight == 0 {
        return bad("keys, workers and inflight must be at least 1");
    }
    if !(0.0..=0.95).contains(&plan.duplicates) {
        return bad("duplicates is a share of deliveries between 0 and 0.95");
    }
    if plan.lease < Duration::from_millis(200) {
        return bad("the lease must be at least 200ms");
    }
    if plan.fault_every.is_zero() || plan.duration.is_zero() {
        return bad("duration and fault_every must be positive");
    }
    if !plan.worker_bin.is_file() {
        return Err(ChaosError::Plan(format!(
            "worker binary {} not found (build it with cargo build -p idem-chaos)",
            plan.worker_bin.display()
        )));
    }
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf, ChaosError> {
    let dir = std::env::temp_dir().join(format!(
        "idem-chaos-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| harness(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

/// What a worker process said.
#[derive(Debug)]
enum Said {
    Ack {
        id: usize,
        attempt: u32,
        outcome: String,
    },
    Nack {
        id: usize,
        attempt: u32,
        retry: Duration,
        reason: String,
    },
    Exit,
}

#[derive(Debug)]
struct Event {
    slot: usize,
    generation: u64,
    said: Said,
}

fn parse_line(line: &str) -> Option<Said> {
    let mut parts = line.split(' ');
    let kind = parts.next()?;
    let id = parts.next()?.parse().ok()?;
    let attempt = parts.next()?.parse().ok()?;
    match kind {
        "A" => Some(Said::Ack {
            id,
            attempt,
            outcome: parts.next()?.to_owned(),
        }),
        "N" => Some(Said::Nack {
            id,
            attempt,
            retry: Duration::from_millis(parts.next()?.parse().ok()?),
            reason: parts.collect::<Vec<_>>().join(" "),
        }),
        _ => None,
    }
}

/// One worker process.
struct WorkerProc {
    child: Child,
    pid: Pid,
    stdin: ChildStdin,
    generation: u64,
    outstanding: HashSet<usize>,
    stopped_until: Option<Instant>,
}

/// One delivery's state at the broker.
struct Delivery {
    key: usize,
    /// How many times it was handed out.
    attempt: u32,
    acked: bool,
    /// The worker holding it, and since when.
    holder: Option<(usize, Instant)>,
    /// When it is due in the queue, if it is queued. A delivery is queued
    /// at most once: an answer that comes after its visibility timeout
    /// moves it in the queue instead of queuing it a second time (twice
    /// queued, it would be handed to two workers and one of them would
    /// keep it as outstanding for ever, a slot lost).
    queued: Option<Instant>,
}

/// The broker, the workers and the fault injector.
struct Broker {
    worker_bin: PathBuf,
    config: WorkerConfig,
    dir: PathBuf,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    workers: Vec<Option<WorkerProc>>,
    next_generation: u64,
    deliveries: Vec<Delivery>,
    keys: Vec<String>,
    /// Ready (or due at the instant) deliveries.
    pending: BTreeSet<(Instant, usize)>,
    published: usize,
    acked: usize,
    rng: StdRng,
    report: Report,
    visibility: Duration,
    crashes: Vec<Violation>,
    unguarded: u64,
}

impl Broker {
    fn new(plan: &Plan, config: WorkerConfig, dir: PathBuf) -> Self {
        let mut rng = StdRng::seed_from_u64(plan.seed);
        let keys: Vec<String> = (0..plan.keys).map(|i| format!("k{i:06}")).collect();
        // Rounded, so a share of 0.33 of 300 keys gives 148 duplicates.
        let extra = ((plan.keys as f64) * plan.duplicates / (1.0 - plan.duplicates)).round();
        let extra = extra as usize;
        let mut order: Vec<usize> = (0..plan.keys).collect();
        order.extend((0..extra).map(|_| rng.random_range(0..plan.keys)));
        order.shuffle(&mut rng);
        let deliveries = order
            .into_iter()
            .map(|key| Delivery {
                key,
                attempt: 0,
                acked: false,
                holder: None,
                queued: None,
            })
            .collect();
        let (events_tx, events) = mpsc::unbounded_channel();
        Self {
            worker_bin: plan.worker_bin.clone(),
            config,
            dir,
            events_tx,
            events,
            workers: (0..plan.workers).map(|_| None).collect(),
            next_generation: 0,
            deliveries,
            keys,
            pending: BTreeSet::new(),
            published: 0,
            acked: 0,
            rng,
            report: Report {
                target: plan.target,
                seed: plan.seed,
                keys: plan.keys,
                deliveries: plan.keys + extra,
                duplicates: extra,
                redeliveries: 0,
                acked_executed: 0,
                acked_replayed: 0,
                executions: 0,
                stale_writes: 0,
                lease_lost: 0,
                faults: BTreeMap::new(),
                retry_reasons: BTreeMap::new(),
                elapsed: Duration::ZERO,
                violations: Vec::new(),
                kept: None,
            },
            visibility: plan.lease.mul_f64(1.5),
            crashes: Vec::new(),
            unguarded: 0,
        }
    }

    fn spawn(&mut self, slot: usize) -> Result<(), ChaosError> {
        let generation = self.next_generation;
        self.next_generation += 1;
        let log = self.dir.join(format!("worker-{slot}-{generation}.err"));
        let stderr = File::create(&log).map_err(|e| harness(format!("{}: {e}", log.display())))?;
        // Where clients' clocks decide, each worker's disagrees with the
        // others' by up to half a lease.
        let half = i64::try_from(self.config.lease.as_millis() / 2).unwrap_or(i64::MAX);
        let skew = if self.config.target.skews_worker_clocks() {
            self.rng.random_range(-half..=half)
        } else {
            0
        };
        let mut child = Command::new(&self.worker_bin)
            .arg("worker")
            .envs(self.config.to_env())
            .env(crate::worker::SKEW_ENV, skew.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| harness(format!("starting a worker: {e}")))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| harness("a worker without a PID"))?;
        let stdin = child.stdin.take().ok_or_else(|| harness("no stdin pipe"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| harness("no stdout pipe"))?;
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(said) = parse_line(&line) {
                    let _ = events.send(Event {
                        slot,
                        generation,
                        said,
                    });
                }
            }
            let _ = events.send(Event {
                slot,
                generation,
                said: Said::Exit,
            });
        });
        self.workers[slot] = Some(WorkerProc {
            child,
            pid: Pid::from_raw(pid),
            stdin,
            generation,
            outstanding: HashSet::new(),
            stopped_until: None,
        });
        Ok(())
    }

    /// Takes the deliveries `slot` holds back into the queue.
    fn requeue_all(&mut self, slot: usize, now: Instant) {
        let Some(worker) = self.workers[slot].as_mut() else {
            return;
        };
        let held: Vec<usize> = worker.outstanding.drain().collect();
        for id in held {
            self.deliveries[id].holder = None;
            self.queue(now, id);
        }
    }

    /// Queues delivery `id` to be handed out at `due`, moving it if it is
    /// queued already.
    fn queue(&mut self, due: Instant, id: usize) {
        let d = &mut self.deliveries[id];
        if let Some(old) = d.queued.replace(due) {
            self.pending.remove(&(old, id));
        }
        self.pending.insert((due, id));
    }

    /// SIGKILLs every worker at once (through `Child::start_kill`), waits
    /// for them all and starts replacements: the crash of a store that
    /// lives in its clients' processes.
    async fn kill_all(&mut self, now: Instant) -> Result<(), ChaosError> {
        let mut dead = Vec::new();
        for slot in 0..self.workers.len() {
            self.requeue_all(slot, now);
            if let Some(mut worker) = self.workers[slot].take() {
                let _ = worker.child.start_kill();
                dead.push(worker.child);
            }
        }
        for mut child in dead {
            let _ = child.wait().await;
        }
        for slot in 0..self.workers.len() {
            self.spawn(slot)?;
        }
        Ok(())
    }

    /// SIGKILLs the worker in `slot` (by PID, through `Child::kill`) and
    /// starts a replacement.
    async fn kill(&mut self, slot: usize, now: Instant) -> Result<(), ChaosError> {
        self.requeue_all(slot, now);
        if let Some(mut worker) = self.workers[slot].take() {
            let _ = worker.child.kill().await;
        }
        self.spawn(slot)
    }

    /// Writes `line` to the worker in `slot` (a dead one's pipe fails; its
    /// end is noticed elsewhere).
    async fn tell(&mut self, slot: usize, line: &str) {
        if let Some(worker) = self.workers[slot].as_mut() {
            let _ = worker.stdin.write_all(line.as_bytes()).await;
        }
    }

    fn signal(&self, slot: usize, signal: Signal) {
        if let Some(worker) = &self.workers[slot] {
            // The PID is our own live child's, checked positive at spawn.
            let _ = kill(worker.pid, signal);
        }
    }

    fn running_slots(&self) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|s| {
                self.workers[*s]
                    .as_ref()
                    .is_some_and(|w| w.stopped_until.is_none())
            })
            .collect()
    }

    /// Running workers holding deliveries, or else all running workers:
    /// a process fault should land in the middle of work.
    fn busy_slots(&self) -> Vec<usize> {
        let running = self.running_slots();
        let busy: Vec<usize> = running
            .iter()
            .copied()
            .filter(|s| {
                self.workers[*s]
                    .as_ref()
                    .is_some_and(|w| !w.outstanding.is_empty())
            })
            .collect();
        if busy.is_empty() {
            running
        } else {
            busy
        }
    }

    /// Whether an answer to attempt `attempt` of delivery `id` is the
    /// current one (not a late answer to a delivery handed out again); if
    /// so the delivery is taken back from its worker.
    fn answered(&mut self, id: usize, attempt: u32) -> Result<bool, ChaosError> {
        let d = self
            .deliveries
            .get(id)
            .ok_or_else(|| harness(format!("a worker answered unknown delivery {id}")))?;
        if d.acked || d.attempt != attempt {
            return Ok(false);
        }
        self.take_back(id);
        Ok(true)
    }

    /// Takes delivery `id` back from the worker holding it.
    fn take_back(&mut self, id: usize) {
        if let Some((slot, _)) = self.deliveries[id].holder.take() {
            if let Some(w) = self.workers[slot].as_mut() {
                w.outstanding.remove(&id);
            }
        }
    }

    fn handle(&mut self, event: Event, now: Instant) -> Result<(), ChaosError> {
        let current = self.workers[event.slot]
            .as_ref()
            .is_some_and(|w| w.generation == event.generation);
        match event.said {
            Said::Exit if current => {
                let log = self
                    .dir
                    .join(format!("worker-{}-{}.err", event.slot, event.generation));
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: String = tail.lines().rev().take(5).collect::<Vec<_>>().join(" / ");
                self.crashes.push(Violation {
                    key: None,
                    what: format!("a worker exited on its own: {tail}"),
                });
                self.requeue_all(event.slot, now);
                self.workers[event.slot] = None;
                self.spawn(event.slot)?;
            }
            Said::Exit => {}
            Said::Ack {
                id,
                attempt,
                outcome,
            } => {
                if !self.answered(id, attempt)? {
                    return Ok(());
                }
                let d = &mut self.deliveries[id];
                d.acked = true;
                if let Some(due) = d.queued.take() {
                    self.pending.remove(&(due, id));
                }
                self.acked += 1;
                match outcome.as_str() {
                    "executed" => self.report.acked_executed += 1,
                    "replayed" => self.report.acked_replayed += 1,
                    _ => self.unguarded += 1,
                }
            }
            Said::Nack {
                id,
                attempt,
                retry,
                reason,
            } => {
                *self.report.retry_reasons.entry(reason).or_insert(0) += 1;
                if !self.answered(id, attempt)? {
                    return Ok(());
                }
                self.queue(now + retry.min(Duration::from_secs(1)), id);
            }
        }
        Ok(())
    }

    /// Hands out due deliveries to running workers with room, and takes
    /// back those held past the visibility timeout.
    async fn dispatch(&mut self, now: Instant, inflight: usize) {
        let mut expired = Vec::new();
        for w in self.workers.iter().flatten() {
            for id in &w.outstanding {
                if let Some((_, since)) = self.deliveries[*id].holder {
                    if now.duration_since(since) > self.visibility {
                        expired.push(*id);
                    }
                }
            }
        }
        for id in expired {
            self.take_back(id);
            self.queue(now, id);
        }
        let mut slots = self.running_slots();
        slots.shuffle(&mut self.rng);
        'slots: for slot in slots {
            loop {
                let room = self.workers[slot]
                    .as_ref()
                    .is_some_and(|w| w.outstanding.len() < inflight);
                if !room {
                    continue 'slots;
                }
                let Some(&(due, id)) = self.pending.first() else {
                    return;
                };
                if due > now {
                    return;
                }
                self.pending.pop_first();
                let d = &mut self.deliveries[id];
                d.queued = None;
                if d.attempt > 0 {
                    self.report.redeliveries += 1;
                }
                d.attempt += 1;
                d.holder = Some((slot, now));
                let line = format!("D {id} {} {}\n", d.attempt, self.keys[d.key]);
                let Some(w) = self.workers[slot].as_mut() else {
                    continue 'slots;
                };
                w.outstanding.insert(id);
                // A dead worker's pipe fails; its Exit event requeues.
                let _ = w.stdin.write_all(line.as_bytes()).await;
            }
        }
    }

    /// Publishes, dispatches, injects faults and takes answers until every
    /// delivery is acknowledged, or the settle limit passes.
    async fn drive(
        &mut self,
        plan: &Plan,
        servers: &Servers,
        progress: &impl Fn(Progress),
    ) -> Result<Report, ChaosError> {
        for slot in 0..plan.workers {
            self.spawn(slot)?;
        }
        let start = Instant::now();
        let fault_end = start + plan.duration;
        let mut injector = Injector::new(plan, start);
        let mut restart: Option<tokio::task::JoinHandle<Result<(), ServerError>>> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        let mut shown = start;
        let total = self.deliveries.len();
        loop {
            tokio::select! {
                Some(event) = self.events.recv() => self.handle(event, Instant::now())?,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            // Publish at an even pace over the fault phase.
            let due = if now >= fault_end {
                total
            } else {
                let share = now.duration_since(start).as_secs_f64() / plan.duration.as_secs_f64();
                ((total as f64) * share) as usize
            };
            while self.published < due.min(total) {
                self.queue(now, self.published);
                self.published += 1;
            }
            if restart.as_ref().is_some_and(|h| h.is_finished()) {
                if let Some(handle) = restart.take() {
                    handle
                        .await
                        .map_err(harness)?
                        .map_err(|source| ChaosError::Server {
                            what: "a store fault (restart, failover, slot move or lock hold)",
                            source,
                        })?;
                }
            }
            for slot in 0..self.workers.len() {
                let wake = self.workers[slot]
                    .as_ref()
                    .and_then(|w| w.stopped_until)
                    .is_some_and(|until| now >= until || now >= fault_end);
                if wake {
                    self.signal(slot, Signal::SIGCONT);
                    if let Some(w) = self.workers[slot].as_mut() {
                        w.stopped_until = None;
                    }
                }
            }
            if now < fault_end {
                injector
                    .step(now, true, self, servers, &mut restart)
                    .await?;
            } else {
                injector.finish(now, self, servers, &mut restart).await?;
            }
            self.dispatch(now, plan.inflight).await;
            if now.duration_since(shown) > Duration::from_millis(250) {
                shown = now;
                progress(Progress {
                    acked: self.acked,
                    deliveries: total,
                    faults: injector.schedule.total(),
                    faulting: now < fault_end,
                });
            }
            let settled = self.acked == total && restart.is_none();
            if now >= fault_end && settled {
                break;
            }
            if now >= fault_end + plan.settle_limit {
                let missing: BTreeSet<&str> = self
                    .deliveries
                    .iter()
                    .filter(|d| !d.acked)
                    .map(|d| self.keys[d.key].as_str())
                    .collect();
                self.report.violations.push(Violation {
                    key: None,
                    what: format!(
                        "{} keys never acknowledged within {:?} of the faults ending: {:?}",
                        missing.len(),
                        plan.settle_limit,
                        missing.iter().take(10).collect::<Vec<_>>()
                    ),
                });
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
                            now.duration_since(since).as_secs_f64()
                        ),
                        None if d.queued.is_some() => "queued".to_owned(),
                        None => "neither held nor queued".to_owned(),
                    };
                    self.report.violations.push(Violation {
                        key: Some(self.keys[d.key].clone()),
                        what: format!(
                            "delivery {id} unacknowledged: handed out {} times, {whereabouts}",
                            d.attempt
                        ),
                    });
                }
                break;
            }
        }
        if let Some(handle) = restart.take() {
            let _ = handle.await;
        }
        let mut report = self.report.clone();
        report.elapsed = start.elapsed();
        report.faults = injector.schedule.counts;
        report.violations.append(&mut self.crashes);
        if self.unguarded > 0 {
            report.violations.push(Violation {
                key: None,
                what: format!(
                    "{} deliveries ran unguarded (the executor must fail closed)",
                    self.unguarded
                ),
            });
        }
        Ok(report)
    }

    async fn stop_workers(&mut self) {
        for slot in 0..self.workers.len() {
            self.signal(slot, Signal::SIGCONT);
            if let Some(mut worker) = self.workers[slot].take() {
                let _ = worker.child.kill().await;
            }
        }
    }
}

/// Injects seeded faults and lifts the timed ones.
struct Injector {
    schedule: Schedule,
    proxy_faults: ProxyFaults,
    lease: Duration,
    /// Store faults (restart, failover, slot move, lock hold) that came
    /// due while another was still under way, each kind once, those never
    /// injected yet first: injected one by one as the one under way ends,
    /// even after the fault phase, so a slow failover does not crowd the
    /// slot moves out of a run.
    deferred: VecDeque<FaultKind>,
}

impl Injector {
    fn new(plan: &Plan, start: Instant) -> Self {
        Self {
            schedule: Schedule::new(
                plan.seed ^ 0x6661_756c_7473,
                plan.faults.clone(),
                plan.fault_every,
                start,
            ),
            proxy_faults: ProxyFaults::new(1..64),
            lease: plan.lease,
            deferred: VecDeque::new(),
        }
    }

    /// Injects the fault due at `now`, if one is and `dealing` (the fault
    /// phase), or else a deferred store fault once none is under way.
    async fn step(
        &mut self,
        now: Instant,
        dealing: bool,
        broker: &mut Broker,
        servers: &Servers,
        restart: &mut Option<tokio::task::JoinHandle<Result<(), ServerError>>>,
    ) -> Result<(), ChaosError> {
        self.proxy_faults.lift_due(now, &servers.proxies);
        let due = if dealing {
            self.schedule.due(now)
        } else {
            None
        };
        let kind = match due {
            Some(kind) => kind,
            None if restart.is_none() => match self.deferred.pop_front() {
                Some(kind) => kind,
                None => return Ok(()),
            },
            None => return Ok(()),
        };
        // Drawn whether or not the fault can be injected, so the stream of
        // random numbers does not depend on timing.
        let pick = self.schedule.rng.random_range(0..usize::MAX);
        let applied = match kind {
            FaultKind::Kill | FaultKind::Stop => {
                let slots = broker.busy_slots();
                match slots.get(pick % slots.len().max(1)) {
                    Some(&slot) if kind == FaultKind::Kill => {
                        broker.kill(slot, now).await?;
                        true
                    }
                    Some(&slot) => {
                        let stop = self.lease.mul_f64(self.schedule.rng.random_range(1.5..3.0));
                        broker.signal(slot, Signal::SIGSTOP);
                        if let Some(w) = broker.workers[slot].as_mut() {
                            w.stopped_until = Some(now + stop);
                        }
                        true
                    }
                    None => false,
                }
            }
            FaultKind::Clock if broker.config.target.reads_worker_clock() => {
                let slots = broker.busy_slots();
                match slots.get(pick % slots.len().max(1)) {
                    Some(&slot) => {
                        let jump = self.lease.mul_f64(self.schedule.rng.random_range(1.5..3.0));
                        let ms = i64::try_from(jump.as_millis()).unwrap_or(i64::MAX);
                        let ms = if self.schedule.rng.random_bool(0.5) {
                            ms
                        } else {
                            -ms
                        };
                        broker.tell(slot, &format!("C {ms}\n")).await;
                        true
                    }
                    None => false,
                }
            }
            FaultKind::Clock => false,
            FaultKind::StoreRestart if broker.config.target == Target::SqliteLease => {
                broker.kill_all(now).await?;
                true
            }
            FaultKind::StoreRestart => {
                let down = self.schedule.millis(100..800);
                if restart.is_none() {
                    *restart = Some(servers.restart_store(down));
                    true
                } else {
                    self.defer(kind);
                    false
                }
            }
            FaultKind::Migrate => {
                let slots = self.schedule.rng.random_range(20..200);
                let handle = restart
                    .is_none()
                    .then(|| servers.migrate(slots, pick))
                    .flatten();
                let applied = handle.is_some();
                if applied {
                    *restart = handle;
                } else if restart.is_some() {
                    self.defer(kind);
                }
                applied
            }
            FaultKind::Locks => {
                let hold = self.schedule.millis(100..600);
                if restart.is_none() {
                    *restart = Some(servers.hold_locks(hold));
                    true
                } else {
                    self.defer(kind);
                    false
                }
            }
            proxied => self
                .proxy_faults
                .apply(proxied, now, &mut self.schedule, &servers.proxies),
        };
        if applied {
            self.schedule.injected(kind);
        } else if !self.deferred.contains(&kind) {
            self.schedule.missed(kind);
        }
        Ok(())
    }

    /// Queues store fault `kind` for when the one under way ends.
    fn defer(&mut self, kind: FaultKind) {
        if self.deferred.contains(&kind) {
            return;
        }
        if self.schedule.counts.contains_key(&kind) {
            self.deferred.push_back(kind);
        } else {
            self.deferred.push_front(kind);
        }
    }

    /// After the fault phase: lifts the proxies' faults and injects the
    /// store faults still deferred, one at a time.
    async fn finish(
        &mut self,
        now: Instant,
        broker: &mut Broker,
        servers: &Servers,
        restart: &mut Option<tokio::task::JoinHandle<Result<(), ServerError>>>,
    ) -> Result<(), ChaosError> {
        self.proxy_faults.heal(&servers.proxies);
        if restart.is_none() && !self.deferred.is_empty() {
            self.step(now, false, broker, servers, restart).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker() -> Broker {
        let plan = Plan {
            keys: 3,
            duplicates: 0.0,
            ..Plan::new(Target::SqliteLease, "/nonexistent")
        };
        let config = WorkerConfig {
            target: plan.target,
            store_url: String::new(),
            downstream_url: String::new(),
            lease: plan.lease,
            inflight: plan.inflight,
            ledger_dir: PathBuf::new(),
        };
        Broker::new(&plan, config, PathBuf::new())
    }

    /// Hands delivery `id` to `slot` as `dispatch` does, without a worker.
    fn hand_out(b: &mut Broker, id: usize, slot: usize, now: Instant) {
        assert_eq!(b.pending.pop_first().map(|(_, p)| p), Some(id));
        let d = &mut b.deliveries[id];
        d.queued = None;
        d.attempt += 1;
        d.holder = Some((slot, now));
    }

    /// A delivery taken back at its visibility timeout, then answered by
    /// the worker that held it, is queued once: queued twice it would be
    /// handed to two workers and leak a slot in one of them, and the run
    /// would stop handing out work (the DynamoDB short run's stalls).
    #[test]
    fn a_late_answer_moves_a_requeued_delivery_instead_of_queuing_it_again() {
        let mut b = broker();
        let now = Instant::now();
        b.queue(now, 0);
        hand_out(&mut b, 0, 1, now);
        b.take_back(0);
        b.queue(now, 0);
        let nack = Said::Nack {
            id: 0,
            attempt: 1,
            retry: Duration::from_millis(200),
            reason: "busy".into(),
        };
        b.handle(
            Event {
                slot: 1,
                generation: 0,
                said: nack,
            },
            now,
        )
        .expect("a current answer");
        assert_eq!(b.pending.len(), 1, "{:?}", b.pending);
        assert_eq!(
            b.deliveries[0].queued,
            Some(now + Duration::from_millis(200))
        );

        // A late acknowledgement takes it out of the queue altogether.
        let ack = Said::Ack {
            id: 0,
            attempt: 1,
            outcome: "executed".into(),
        };
        b.handle(
            Event {
                slot: 1,
                generation: 0,
                said: ack,
            },
            now,
        )
        .expect("a current answer");
        assert!(b.pending.is_empty(), "{:?}", b.pending);
        assert_eq!(b.acked, 1);
    }
}
