//! What the store benchmarks share: a closed-loop rate measurement and
//! the `--secs N` argument; and, with the `consumers` feature, the
//! consumer benchmark (`consumers`), written once for every broker.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, Store};

#[cfg(feature = "consumers")]
pub mod consumers;

/// Runs `callers` tasks for `secs`, each looping over `work(caller, i)`
/// which returns how many units it did; returns units per second.
///
/// # Panics
///
/// If a task panics (a benchmark's work asserts what it gets back).
pub async fn rate<F, Fut>(callers: usize, secs: f64, work: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = u64> + Send,
{
    let work = Arc::new(work);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (work, stop, done) = (Arc::clone(&work), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    done.fetch_add(work(c, i).await, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("bench task");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// One claim and completion of a fresh key: the pair the store
/// benchmarks count.
///
/// # Panics
///
/// If the key is not acquired, or the store fails.
pub async fn pair<S: Store + ?Sized>(
    store: &S,
    id: &RecordId,
    params: &ClaimParams,
    response: Bytes,
    retention: Duration,
) {
    let ClaimOutcome::Acquired(lease) = store.claim(id, params).await.expect("claim") else {
        panic!("fresh keys are acquired");
    };
    store
        .complete(&lease, response, retention)
        .await
        .expect("complete");
}

/// The seconds per point a benchmark was given as `--secs N` on its
/// command line, or `default`.
pub fn secs_arg(default: f64) -> f64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The number a benchmark was given as `NAME N` on its command line, or
/// `default`.
pub fn count_arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

/// The median of the rounds' results (the upper one of an even count).
pub fn median(mut results: Vec<f64>) -> f64 {
    results.sort_by(f64::total_cmp);
    results[results.len() / 2]
}

/// CPU time spent during a benchmark phase, read from Linux's `/proc`:
/// what the whole machine and this process used. Benchmarks here share
/// two cores between the client, the broker and the store, so where the
/// CPU went says more about a rate than the rate alone.
#[derive(Debug, Clone, Copy)]
pub struct CpuMeter {
    started: Instant,
    machine: u64,
    process: u64,
}

/// What [`CpuMeter::stop`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    /// Wall-clock time of the phase.
    pub wall: Duration,
    /// CPU time the whole machine was busy (all processes, all cores).
    pub machine: Duration,
    /// CPU time of this process (the benchmark's client).
    pub process: Duration,
    /// How many cores the machine has.
    pub cores: usize,
}

impl CpuUse {
    /// The share of the machine's cores that were busy, 0 to 1.
    pub fn busy(&self) -> f64 {
        self.machine.as_secs_f64() / (self.wall.as_secs_f64() * self.cores as f64)
    }
}

/// Linux's clock ticks per second for `/proc` times (`USER_HZ`).
const TICKS: f64 = 100.0;

impl CpuMeter {
    /// Starts measuring.
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            machine: machine_busy_ticks(),
            process: process_ticks(),
        }
    }

    /// What was used since [`start`](Self::start). Reads as zero where
    /// `/proc` is not there.
    pub fn stop(&self) -> CpuUse {
        let busy = machine_busy_ticks();
        CpuUse {
            wall: self.started.elapsed(),
            machine: ticks(busy.saturating_sub(self.machine)),
            process: ticks(process_ticks().saturating_sub(self.process)),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

/// The machine's busy ticks, from the first line of `/proc/stat` (idle
/// and iowait count as not busy).
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|n| n.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    total - idle
}

/// This process's user and system ticks, from `/proc/self/stat`.
fn process_ticks() -> u64 {
    proc_ticks("self").map_or(0, |t| t.own)
}

/// What `/proc/PID/stat` says of a process's CPU, in clock ticks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcTicks {
    /// User and system time of the process itself.
    pub(crate) own: u64,
    /// User and system time of its children that exited and were waited
    /// for.
    pub(crate) exited_children: u64,
    /// Its parent's pid.
    pub(crate) parent: u32,
}

/// The CPU ticks of process `pid` (`"self"` for this one), or `None`
/// where `/proc` does not have it.
pub(crate) fn proc_ticks(pid: &str) -> Option<ProcTicks> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at the
    // state, field 3: the parent is field 4, utime, stime, cutime and
    // cstime fields 14 to 17.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(ProcTicks {
        own: number(11)? + number(12)?,
        exited_children: number(13)? + number(14)?,
        parent: u32::try_from(number(1)?).ok()?,
    })
}

/// Clock ticks as time.
pub(crate) fn ticks(n: u64) -> Duration {
    Duration::from_secs_f64(n as f64 / TICKS)
}

/// CPU per message of a consumer benchmark's phase, summed over its
/// rounds: the client (this process), the store's server, and everything
/// else that ran (the broker, mostly).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuPerMessage {
    messages: u64,
    machine: Duration,
    client: Duration,
    store: Duration,
    busy: f64,
    rounds: u32,
}

impl CpuPerMessage {
    /// Adds a round of `messages` that used `cpu`, `store` of it in the
    /// store's server.
    pub fn add(&mut self, messages: usize, cpu: CpuUse, store: Duration) {
        self.messages += messages as u64;
        self.machine += cpu.machine;
        self.client += cpu.process;
        self.store += store;
        self.busy += cpu.busy();
        self.rounds += 1;
    }

    fn micros(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.messages.max(1) as f64
    }

    /// `client / store / rest` in microseconds per message, and how busy
    /// the machine was, for a table cell.
    pub fn cell(&self) -> String {
        let rest = self.machine.saturating_sub(self.client + self.store);
        format!(
            "{:.0} / {:.0} / {:.0} ({:.0} % busy)",
            self.micros(self.client),
            self.micros(self.store),
            self.micros(rest),
            100.0 * self.busy / f64::from(self.rounds.max(1))
        )
    }
}

/// One way a consumer benchmark drains its queue, over its rounds: the
/// rate of each round and the CPU it used.
#[derive(Debug, Default)]
pub struct Phase {
    rates: Vec<f64>,
    cpu: CpuPerMessage,
}

impl Phase {
    /// Runs `drain` (which drains `messages` and returns its rate) and
    /// records its rate and CPU; `store_cpu` reads the store server's CPU
    /// time so far.
    pub async fn measure(
        &mut self,
        messages: usize,
        store_cpu: impl Fn() -> Duration,
        drain: impl Future<Output = f64>,
    ) {
        let (meter, store_before) = (CpuMeter::start(), store_cpu());
        self.rates.push(drain.await);
        let store = store_cpu().saturating_sub(store_before);
        self.cpu.add(messages, meter.stop(), store);
    }

    /// The median rate of the rounds.
    pub fn rate(&self) -> f64 {
        median(self.rates.clone())
    }

    /// CPU per message, for a table cell.
    pub fn cpu(&self) -> String {
        self.cpu.cell()
    }
}
