//! The worker run: the fault proxy, worker processes and the broker that
//! feeds them, as a [target](chaos::Target) of the shared fault engine,
//! between starting the servers ([`crate::servers`]) and gathering the
//! evidence for the checker ([`crate::evidence`]).

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idem_sqlite::SqliteStore;
use idem_testkit::chaos::{self, Clock, Fault, Findings, Injected, Link, Progress, Report};
use idem_testkit::doubles::proxy::FaultProxy;
use idem_testkit::ServerError;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::check::{Tally, Violation};
use crate::error::{harness, ChaosError};
use crate::evidence::collect_evidence;
use crate::servers::{sqlite_file, Servers};
use crate::worker::WorkerConfig;
use crate::{Plan, Target};

/// Runs `plan` and checks it; `progress` is called a few times a second.
pub async fn run(plan: &Plan, progress: impl Fn(Progress)) -> Result<Report, ChaosError> {
    validate(plan)?;
    if plan.target.is_http() {
        return crate::http::run(plan, progress).await;
    }
    let servers = Servers::start(plan.target, plan.redis_append_only, plan.replica_acks).await?;
    let dir = run_dir("idem-chaos")?;
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
    broker.servers = Some(servers);
    let report = chaos::run(&plan.fault_plan(), broker, progress).await?;
    Ok(keep_if_violated(report, dir))
}

/// Removes the run's directory of ledgers and logs, or keeps it (and
/// says where) when the run found violations.
pub(crate) fn keep_if_violated(mut report: Report, dir: PathBuf) -> Report {
    if report.violations().is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        report.findings.violations.push(Violation::run(format!(
            "ledgers and logs kept in {}",
            dir.display()
        )));
        report.findings.kept = Some(dir);
    }
    report
}

fn validate(plan: &Plan) -> Result<(), ChaosError> {
    let bad = |why: &str| Err(ChaosError::Plan(why.to_owned()));
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

/// A new directory for a run's ledgers and logs, named after `what`.
pub(crate) fn run_dir(what: &str) -> Result<PathBuf, ChaosError> {
    let dir = std::env::temp_dir().join(format!(
        "{what}-{}-{:08x}",
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
    /// Stopped (SIGSTOP) until the engine has it continued.
    stopped: bool,
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

/// The broker and the workers: the worker run's [target](chaos::Target).
struct Broker {
    target: Target,
    worker_bin: PathBuf,
    config: WorkerConfig,
    dir: PathBuf,
    /// The servers, the store's fault proxies among them (set before the
    /// run starts; taken for the evidence at its end).
    servers: Option<Servers>,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    /// Paces the steps when no worker says anything.
    tick: Option<tokio::time::Interval>,
    workers: Vec<Option<WorkerProc>>,
    next_generation: u64,
    deliveries: Vec<Delivery>,
    keys: Vec<String>,
    /// Ready (or due at the instant) deliveries.
    pending: BTreeSet<(Instant, usize)>,
    published: usize,
    acked: usize,
    inflight: usize,
    rng: StdRng,
    tally: Tally,
    visibility: Duration,
    /// The store fault under way (restart, failover, slot move, lock
    /// hold), if one is.
    store_fault: Option<JoinHandle<Result<(), ServerError>>>,
    crashes: Vec<Violation>,
    unguarded: u64,
}

impl Broker {
    fn new(plan: &Plan, config: WorkerConfig, dir: PathBuf) -> Self {
        let mut rng = StdRng::seed_from_u64(plan.seed);
        let order = plan.deliveries(&mut rng);
        let extra = order.len() - plan.keys;
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
            target: plan.target,
            worker_bin: plan.worker_bin.clone(),
            config,
            dir,
            servers: None,
            events_tx,
            events,
            tick: None,
            workers: (0..plan.workers).map(|_| None).collect(),
            next_generation: 0,
            deliveries,
            keys: plan.key_names(),
            pending: BTreeSet::new(),
            published: 0,
            acked: 0,
            inflight: plan.inflight,
            rng,
            tally: Tally {
                deliveries: plan.keys + extra,
                duplicates: extra,
                ..Tally::default()
            },
            visibility: plan.lease.mul_f64(1.5),
            store_fault: None,
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
            stopped: false,
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
            .filter(|s| self.workers[*s].as_ref().is_some_and(|w| !w.stopped))
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
                    "executed" => self.tally.acked_executed += 1,
                    "replayed" => self.tally.acked_replayed += 1,
                    _ => self.unguarded += 1,
                }
            }
            Said::Nack {
                id,
                attempt,
                retry,
                reason,
            } => {
                *self.tally.retry_reasons.entry(reason).or_insert(0) += 1;
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
                    self.tally.redeliveries += 1;
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

    async fn stop_workers(&mut self) {
        for slot in 0..self.workers.len() {
            self.signal(slot, Signal::SIGCONT);
            if let Some(mut worker) = self.workers[slot].take() {
                let _ = worker.child.kill().await;
            }
        }
    }

    /// A slot drawn from the busy workers' by `pick`.
    fn busy_slot(&self, pick: usize) -> Option<usize> {
        let slots = self.busy_slots();
        slots.get(pick % slots.len().max(1)).copied()
    }

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
