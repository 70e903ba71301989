//! The fault-injection run for broker adapters (docs/design.md §12): worker
//! processes consume a published workload with duplicates and poison
//! messages from a real broker, with their records in a real store, while
//! faults are injected at seeded random points:
//!
//! - a worker SIGKILLed (and replaced), mid-handler or anywhere else;
//! - a worker SIGSTOPped for 1.5 to 3 leases, then SIGCONTed: a stale
//!   holder that wakes up mid-handler;
//! - a worker told to leave cleanly (it finishes what it holds; a Kafka
//!   member commits and leaves its group) while a new one joins;
//! - the broker killed and started again (it keeps what it stored);
//! - the store killed and started again (a Redis of the run's own, with
//!   an fsync-always append-only file; a store on the broker's own
//!   server, as SQS's DynamoDB on moto, is not restarted, nor is a broker
//!   that keeps nothing across a restart);
//! - the connection to the broker, or to the store, reset, delayed or
//!   blackholed for a while, through a [`FaultProxy`] in front of each.
//!
//! The handler is [`fenced_handler`](crate::consumers::ledger::fenced_handler): a
//! handler can run again after a crash or a takeover, so its effect is a
//! fenced write. After the fault phase the run heals everything, waits
//! until every message is settled, and [judges](judge) the ledger,
//! the downstream, the store's records and the dead-letters: every good
//! message completed by the holder whose write the downstream holds, no
//! completed key claimed again, none lost, and dead-letters for the poison
//! messages only.
//!
//! An adapter's tests run it with [`run`] over their [`ChaosBroker`];
//! `scripts/chaos-consumers` runs the long version ([`ChaosPlan::from_env`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::faults::Schedule;
use crate::consumers::ledger::{eventually, Work};
use crate::consumers::scenario::{spawn_worker, LEASE};
use crate::consumers::under_test::ChaosBroker;
use crate::doubles::proxy::FaultProxy;
use crate::servers::redis::RedisServer;

pub use super::judge::{judge, Evidence};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// SIGKILL a worker; a new one replaces it.
    Kill,
    /// SIGSTOP a worker for 1.5 to 3 leases, then SIGCONT it.
    Stop,
    /// Make a worker leave cleanly (its stdin closed: it stops taking
    /// deliveries, finishes those in flight and, on Kafka, leaves its
    /// group) while a new one joins in its place.
    Leave,
    /// Kill the broker and start it again.
    BrokerRestart,
    /// Kill the store and start it again.
    StoreRestart,
    /// Reset every connection to the broker.
    BrokerReset,
    /// Delay every chunk to and from the broker for a while.
    BrokerLatency,
    /// Let nothing through to the broker for a while.
    BrokerBlackhole,
    /// Reset every connection to the store.
    StoreReset,
    /// Delay every chunk to and from the store for a while.
    StoreLatency,
    /// Let nothing through to the store for a while.
    StoreBlackhole,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 11] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Leave,
        Fault::BrokerRestart,
        Fault::StoreRestart,
        Fault::BrokerReset,
        Fault::BrokerLatency,
        Fault::BrokerBlackhole,
        Fault::StoreReset,
        Fault::StoreLatency,
        Fault::StoreBlackhole,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::Leave => "leave",
            Fault::BrokerRestart => "broker-restart",
            Fault::StoreRestart => "store-restart",
            Fault::BrokerReset => "broker-reset",
            Fault::BrokerLatency => "broker-latency",
            Fault::BrokerBlackhole => "broker-blackhole",
            Fault::StoreReset => "store-reset",
            Fault::StoreLatency => "store-latency",
            Fault::StoreBlackhole => "store-blackhole",
        }
    }
}

/// What a run does. [`ChaosPlan::short`] is the suite's run; the fields
/// say what to change.
#[derive(Debug, Clone)]
pub struct ChaosPlan {
    /// Seeds the workload and every fault.
    pub seed: u64,
    /// Distinct keys; every 25th is poison.
    pub keys: usize,
    /// The share of keys published a second time.
    pub duplicates: f64,
    /// Worker processes.
    pub workers: usize,
    /// How long messages are published and faults injected.
    pub duration: Duration,
    /// The mean time between faults.
    pub fault_every: Duration,
    /// Which faults to inject.
    pub faults: Vec<Fault>,
    /// How long the run may take to settle after the fault phase before
    /// unsettled messages count as lost.
    pub settle_limit: Duration,
}

impl ChaosPlan {
    /// The suite's run: 300 keys, a third published twice, 3 workers, 15 s
    /// of every fault about every second.
    pub fn short() -> Self {
        Self {
            seed: 1,
            keys: 300,
            duplicates: 0.33,
            workers: 3,
            duration: Duration::from_secs(15),
            fault_every: Duration::from_secs(1),
            faults: Fault::ALL.to_vec(),
            settle_limit: Duration::from_secs(120),
        }
    }

    /// The plan with `IDEM_CHAOS_SECS`, `IDEM_CHAOS_SEED`,
    /// `IDEM_CHAOS_KEYS` and `IDEM_CHAOS_FAULTS` (fault names, comma
    /// separated: `kill,leave`) from the environment where set (a long
    /// run scales its keys with its duration unless told).
    ///
    /// # Panics
    ///
    /// On a fault name it does not know, naming the known ones.
    pub fn from_env(mut self) -> Self {
        let var = |name: &str| std::env::var(name).ok()?.parse::<u64>().ok();
        if let Some(secs) = var("IDEM_CHAOS_SECS") {
            self.duration = Duration::from_secs(secs);
            self.keys = (secs as usize * 20).max(self.keys);
        }
        if let Some(seed) = var("IDEM_CHAOS_SEED") {
            self.seed = seed;
        }
        if let Some(keys) = var("IDEM_CHAOS_KEYS") {
            self.keys = keys as usize;
        }
        if let Ok(names) = std::env::var("IDEM_CHAOS_FAULTS") {
            self.faults = names
                .split(',')
                .map(|name| {
                    Fault::ALL
                        .into_iter()
                        .find(|f| f.name() == name.trim())
                        .unwrap_or_else(|| {
                            let known: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
                            panic!("IDEM_CHAOS_FAULTS: no fault {name:?}; known: {known:?}")
                        })
                })
                .collect();
        }
        self
    }
}

/// What a run did and what the checker found.
#[derive(Debug, Clone)]
pub struct ChaosReport {
    /// The broker's name.
    pub broker: String,
    /// The seed.
    pub seed: u64,
    /// Distinct keys.
    pub keys: usize,
    /// Messages published (keys and duplicates).
    pub published: usize,
    /// Handler starts.
    pub starts: usize,
    /// Fenced writes refused as stale.
    pub stale_writes: usize,
    /// Worker processes that exited by themselves (and were replaced).
    pub worker_exits: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, u64>,
    /// From the first publish to the judgement.
    pub elapsed: Duration,
    /// What must never happen, and did.
    pub violations: Vec<String>,
}

impl ChaosReport {
    /// Panics with the violations if there are any.
    pub fn assert_clean(&self) {
        assert!(
            self.violations.is_empty(),
            "{} violations in the {} chaos run (seed {}):\n{}",
            self.violations.len(),
            self.broker,
            self.seed,
            self.violations.join("\n")
        );
    }

    /// A Markdown table row: broker, seed, keys, published, starts,
    /// stale, exits, faults (kind=count), seconds, violations.
    pub fn row(&self) -> String {
        let mut faults = String::new();
        for (kind, n) in &self.faults {
            let _ = write!(faults, "{}={n} ", kind.name());
        }
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            self.broker,
            self.seed,
            self.keys,
            self.published,
            self.starts,
            self.stale_writes,
            self.worker_exits,
            faults.trim_end(),
            self.elapsed.as_secs_f64(),
            self.violations.len()
        )
    }
}

/// The messages of a run in publishing order, as (key, payload): every
/// key once, every 25th poison, and a seeded share published again later.
pub fn workload(plan: &ChaosPlan, rng: &mut StdRng) -> Vec<(String, String)> {
    let message = |i: usize| {
        let key = format!("c-{i}");
        let poison = i % 25 == 24;
        let body = format!(r#"{{"id":"{key}","poison":{poison}}}"#);
        (key, body)
    };
    let mut messages: Vec<(String, String)> = (0..plan.keys).map(message).collect();
    let mut again: Vec<(String, String)> = (0..plan.keys)
        .filter(|_| rng.random_bool(plan.duplicates.clamp(0.0, 1.0)))
        .map(message)
        .collect();
    again.shuffle(rng);
    // Each duplicate goes somewhere after its original.
    for (key, body) in again {
        let first = messages.iter().position(|(k, _)| *k == key).unwrap_or(0);
        let at = rng.random_range(first + 1..=messages.len());
        messages.insert(at, (key, body));
    }
    messages
}

/// Runs `plan` on broker `B`: see the [module](crate::chaos).
pub async fn run<B: ChaosBroker>(name: &str, plan: ChaosPlan) -> ChaosReport {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut broker = tokio::task::spawn_blocking(B::start_server)
        .await
        .expect("broker task")
        .expect("a broker of the run's own");
    let mut redis = match B::store_port(&broker) {
        Some(_) => None,
        None => Some(
            RedisServer::start_with(
                crate::free_port().expect("port"),
                &["--appendonly", "yes", "--appendfsync", "always"],
            )
            .expect("redis-server"),
        ),
    };
    let store_port = B::store_port(&broker)
        .or(redis.as_ref().map(RedisServer::port))
        .expect("a store");
    let mut plan = plan;
    plan.faults.retain(|f| match f {
        Fault::BrokerRestart => B::RESTARTS,
        Fault::StoreRestart => redis.is_some(),
        _ => true,
    });
    let broker_proxy = proxy(B::advertised_port(&broker).unwrap_or(0), B::port(&broker)).await;
    let store_proxy = proxy(0, store_port).await;
    let direct = B::create_at(name, B::port(&broker), &B::store_url(store_port)).await;
    let through = direct.through(
        broker_proxy.addr().port(),
        &B::store_url(store_proxy.addr().port()),
    );
    let messages = workload(&plan, &mut rng);
    let mut poison: Vec<String> = messages
        .iter()
        .filter(|(_, body)| body.contains(r#""poison":true"#))
        .map(|(key, _)| key.clone())
        .collect();
    poison.sort();
    poison.dedup();

    let mut workers = Workers {
        env: through.env(),
        running: Vec::new(),
        leaving: Vec::new(),
        exits: 0,
    };
    for _ in 0..plan.workers {
        workers.spawn();
    }
    let restarting = Arc::new(AtomicBool::new(false));
    let publisher = tokio::spawn(publish_over(
        direct.clone(),
        messages.clone(),
        plan.duration,
        Arc::clone(&restarting),
    ));

    let mut faults = Faults::new(&plan);
    let ledger = direct.ledger();
    let end = Instant::now() + plan.duration;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        workers.replace_exited();
        faults.lift_due(&broker_proxy, &store_proxy, &mut workers);
        let Some(kind) = faults.schedule.due(Instant::now()) else {
            continue;
        };
        match kind {
            Fault::Kill => {
                // Alternately mid-handler and between an effect and its
                // acknowledgement.
                let busy = if faults.schedule.counts.get(&kind).copied().unwrap_or(0) % 2 == 0 {
                    ledger.latest_starter()
                } else {
                    ledger.latest_writer()
                };
                let slot = workers.slot_of(busy, &mut faults.schedule.rng);
                workers.kill(slot);
            }
            Fault::Stop => {
                let slot = workers.slot_of(ledger.latest_starter(), &mut faults.schedule.rng);
                let pause = LEASE.mul_f64(faults.schedule.rng.random_range(1.5..3.0));
                match workers.stop(slot) {
                    Some(pid) => faults.stopped.push((Instant::now() + pause, pid)),
                    None => continue,
                }
            }
            Fault::Leave => {
                let slot = workers.slot_of(ledger.latest_starter(), &mut faults.schedule.rng);
                if !workers.leave(slot) {
                    continue;
                }
            }
            Fault::BrokerRestart => {
                restarting.store(true, Ordering::SeqCst);
                broker = tokio::task::spawn_blocking(move || {
                    B::restart(&mut broker).expect("restart the broker");
                    broker
                })
                .await
                .expect("restart task");
                restarting.store(false, Ordering::SeqCst);
            }
            Fault::StoreRestart => {
                if let Some(mut server) = redis.take() {
                    redis = Some(
                        tokio::task::spawn_blocking(move || {
                            server.stop();
                            server.start_again().expect("start the store again");
                            server
                        })
                        .await
                        .expect("restart task"),
                    );
                }
            }
            Fault::BrokerReset => broker_proxy.reset_all(),
            Fault::StoreReset => store_proxy.reset_all(),
            Fault::BrokerLatency | Fault::StoreLatency => {
                let on = if kind == Fault::BrokerLatency {
                    &broker_proxy
                } else {
                    &store_proxy
                };
                on.set_delay(faults.schedule.millis(5..60));
                faults.lift_later(kind);
            }
            Fault::BrokerBlackhole | Fault::StoreBlackhole => {
                let on = if kind == Fault::BrokerBlackhole {
                    &broker_proxy
                } else {
                    &store_proxy
                };
                on.set_blackhole(true);
                faults.lift_later(kind);
            }
        }
        faults.schedule.injected(kind);
    }

    faults.heal(&broker_proxy, &store_proxy, &mut workers);
    let published = publisher.await.expect("publisher task");
    let good: Vec<String> = (0..plan.keys)
        .map(|i| format!("c-{i}"))
        .filter(|k| !poison.contains(k))
        .collect();
    let settle_by = Instant::now() + plan.settle_limit;
    let all_written = eventually(plan.settle_limit, || {
        workers.replace_exited();
        good.iter().all(|k| ledger.downstream(k).is_some())
    })
    .await;
    let store_conn = direct.store().await;
    let mut all_final = false;
    while all_written && !all_final && Instant::now() < settle_by {
        workers.replace_exited();
        all_final = super::judge::records_final(&store_conn, &good, &poison).await;
        if !all_final {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let settled = all_final && direct.settled(poison.len()).await;
    // Late duplicates and redeliveries show themselves before judging.
    tokio::time::sleep(Duration::from_secs(3)).await;
    workers.stop_all();

    let evidence = Evidence::gather(ledger, &store_conn, &good, &poison).await;
    let dead = direct.dead_letters().await;
    let mut violations = judge(&evidence, &dead, &poison);
    if !settled {
        violations.push(format!(
            "the run did not settle within {:?} of the fault phase's end (every good \
             key written: {all_written}; every record completed or failed: {all_final})",
            plan.settle_limit
        ));
    }
    ChaosReport {
        broker: name.to_owned(),
        seed: plan.seed,
        keys: plan.keys,
        published,
        starts: evidence.starts.values().map(Vec::len).sum(),
        stale_writes: ledger.stale_writes(),
        worker_exits: workers.exits,
        faults: faults.schedule.counts,
        elapsed: started.elapsed(),
        violations,
    }
}

/// A fault proxy on loopback port `listen` (a free one for 0) in front
/// of the loopback `port`.
async fn proxy(listen: u16, port: u16) -> FaultProxy {
    FaultProxy::start_on(listen, SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("fault proxy")
}

/// Publishes `messages` evenly over `over`, pausing while the broker
/// restarts. Each publish runs in a task of its own so that one failing
/// as the broker goes down (the adapters' test helpers panic on errors)
/// is tried again: a message the broker stored before the failure is then
/// there twice, a duplicate like the others. How many messages went out.
async fn publish_over<B: ChaosBroker>(
    setup: B,
    messages: Vec<(String, String)>,
    over: Duration,
    restarting: Arc<AtomicBool>,
) -> usize {
    let gap = over.div_f64(messages.len().max(1) as f64 * 1.25);
    let mut published = 0;
    for (key, body) in messages {
        loop {
            while restarting.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (setup, key, body) = (setup.clone(), key.clone(), body.clone());
            let attempt = tokio::spawn(async move { setup.publish(Some(&key), &body).await });
            match tokio::time::timeout(Duration::from_secs(20), attempt).await {
                Ok(Ok(())) => break,
                _ => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
        published += 1;
        tokio::time::sleep(gap).await;
    }
    published
}

/// Sends `signal` to process `pid` with the shell's own `kill` (no
/// procps needed), only ever to a positive process id.
fn send(pid: u32, signal: &str) -> bool {
    pid > 0
        && std::process::Command::new("sh")
            .args([
                "-c",
                r#"kill -s "$1" -- "$2""#,
                "sh",
                signal,
                &pid.to_string(),
            ])
            .status()
            .is_ok_and(|s| s.success())
}

/// The worker processes, by slot, and those leaving.
struct Workers {
    env: Vec<(&'static str, String)>,
    running: Vec<Child>,
    /// Workers told to leave, until they have exited.
    leaving: Vec<Child>,
    exits: usize,
}

impl Workers {
    fn spawn(&mut self) {
        self.running
            .push(spawn_worker(self.env.clone(), &Work::Fenced));
    }

    /// The slot of the worker with process id `pid`, or a random one.
    fn slot_of(&self, pid: Option<u32>, rng: &mut StdRng) -> usize {
        pid.and_then(|pid| self.running.iter().position(|w| w.id() == pid))
            .unwrap_or_else(|| rng.random_range(0..self.running.len()))
    }

    /// SIGKILLs the worker in `slot` and starts a new one there.
    fn kill(&mut self, slot: usize) {
        let Some(worker) = self.running.get_mut(slot) else {
            return;
        };
        let _ = worker.kill();
        let _ = worker.wait();
        *worker = spawn_worker(self.env.clone(), &Work::Fenced);
    }

    /// Closes the stdin of the worker in `slot`, so that it stops cleanly
    /// (see [`worker_main`](crate::consumers::scenario::worker_main)); a new one
    /// takes its place once it has gone, as in a rolling restart. (Tansu,
    /// the Kafka-protocol broker of the tests, stops assigning a group's
    /// partitions for good when a member leaves cleanly while another
    /// joins.)
    /// Whether it was told: the last worker running never is.
    fn leave(&mut self, slot: usize) -> bool {
        if slot >= self.running.len() || self.running.len() < 2 {
            return false;
        }
        let mut old = self.running.remove(slot);
        drop(old.stdin.take());
        self.leaving.push(old);
        true
    }

    /// Stops (SIGSTOP) the worker in `slot`; its process id if it was
    /// stopped.
    fn stop(&self, slot: usize) -> Option<u32> {
        let pid = self.running.get(slot).map(Child::id)?;
        send(pid, "STOP").then_some(pid)
    }

    /// Continues worker process `pid` if it is still one of the running
    /// or leaving workers (a stopped worker may have been killed and
    /// replaced since; one told to leave must run to leave).
    fn resume(&self, pid: u32) {
        if self
            .running
            .iter()
            .chain(&self.leaving)
            .any(|w| w.id() == pid)
        {
            send(pid, "CONT");
        }
    }

    /// Replaces workers that exited by themselves, and those that left
    /// once they have gone.
    fn replace_exited(&mut self) {
        let before = self.leaving.len();
        self.leaving
            .retain_mut(|w| !matches!(w.try_wait(), Ok(Some(_))));
        for _ in self.leaving.len()..before {
            self.spawn();
        }
        for slot in 0..self.running.len() {
            if matches!(self.running[slot].try_wait(), Ok(Some(_))) {
                self.exits += 1;
                self.running[slot] = spawn_worker(self.env.clone(), &Work::Fenced);
            }
        }
    }

    fn stop_all(&mut self) {
        for worker in self.running.iter_mut().chain(&mut self.leaving) {
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// The fault schedule and the faults in force.
struct Faults {
    schedule: Schedule<Fault>,
    /// Proxy faults in force, and when each is lifted.
    timed: Vec<(Instant, Fault)>,
    /// Stopped worker processes, and when each is continued.
    stopped: Vec<(Instant, u32)>,
}

impl Faults {
    fn new(plan: &ChaosPlan) -> Self {
        Self {
            schedule: Schedule::new(
                plan.seed,
                plan.faults.clone(),
                plan.fault_every,
                Instant::now(),
            ),
            timed: Vec::new(),
            stopped: Vec::new(),
        }
    }

    /// Lifts `kind` in 0.3 to 1.5 s.
    fn lift_later(&mut self, kind: Fault) {
        let after = self.schedule.millis(300..1500);
        self.timed.push((Instant::now() + after, kind));
    }

    /// Lifts the proxy faults and continues the workers whose time is up.
    fn lift_due(&mut self, broker: &FaultProxy, store: &FaultProxy, workers: &mut Workers) {
        let now = Instant::now();
        let (over, left): (Vec<_>, Vec<_>) = self.timed.iter().partition(|(end, _)| now >= *end);
        self.timed = left;
        for (_, kind) in over {
            match kind {
                Fault::BrokerLatency => broker.set_delay(Duration::ZERO),
                Fault::StoreLatency => store.set_delay(Duration::ZERO),
                Fault::BrokerBlackhole => broker.set_blackhole(false),
                Fault::StoreBlackhole => store.set_blackhole(false),
                _ => {}
            }
        }
        let (over, left): (Vec<_>, Vec<_>) = self.stopped.iter().partition(|(end, _)| now >= *end);
        self.stopped = left;
        for (_, pid) in over {
            workers.resume(pid);
        }
    }

    /// Lifts every fault and continues every stopped worker.
    fn heal(&mut self, broker: &FaultProxy, store: &FaultProxy, workers: &mut Workers) {
        self.timed.clear();
        broker.heal();
        store.heal();
        for (_, pid) in self.stopped.drain(..) {
            workers.resume(pid);
        }
    }
}

/// An adapter's chaos test file: the worker process the run starts and
/// the short run, over the adapter's [`ChaosBroker`] `$setup`, its
/// destinations named after `$name`. The run's plan is
/// [`ChaosPlan::short`] changed by [`ChaosPlan::from_env`], and its report
/// row is printed (the long runs' table collects it).
#[macro_export]
macro_rules! consumer_chaos {
    ($setup:ty, $name:expr) => {
        /// Not a test on its own: the worker process the chaos run
        /// starts. It consumes until it is killed.
        #[test]
        #[ignore = "a worker process, started by the chaos run"]
        fn worker_process() {
            $crate::consumers::scenario::worker_process::<$setup>();
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[allow(clippy::print_stdout)]
        async fn faults_leave_each_message_completed_once_fenced_and_none_lost() {
            let plan = $crate::chaos::ChaosPlan::short().from_env();
            let report = $crate::chaos::run::<$setup>($name, plan).await;
            println!("\n{}", report.row());
            report.assert_clean();
        }
    };
}
