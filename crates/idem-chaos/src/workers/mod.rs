//! The worker run: the fault proxy, worker processes and the broker that
//! feeds them, as a [target](chaos::Target) of the shared fault engine
//! ([`target`]), between starting the servers ([`crate::servers`]) and
//! gathering the evidence for the checker ([`crate::evidence`]). The
//! broker's deliveries are in [`deliveries`], its worker processes in
//! [`procs`].

mod deliveries;
mod procs;
mod target;

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_sqlite::SqliteStore;
use idem_testkit::chaos::{self, Progress, Report};
use idem_testkit::ServerError;
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::check::{Tally, Violation};
use crate::error::{harness, ChaosError};
use crate::rundir::{keep_if_violated, run_dir};
use crate::servers::{sqlite_file, Servers};
use crate::worker::WorkerConfig;
use crate::{Plan, Target};

/// Runs `plan` and checks it; `progress` is called a few times a second.
pub(crate) async fn run(plan: &Plan, progress: impl Fn(Progress)) -> Result<Report, ChaosError> {
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
    let report = chaos::run(&plan.fault_plan(), &mut broker, progress).await?;
    Ok(keep_if_violated(report, dir))
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
}
