//! The broker adapters' fault-injection target (docs/design.md §12):
//! worker processes consume a published workload with duplicates and
//! poison messages from a real broker, with their records in a real
//! store, while the [engine](super::engine) injects faults at seeded
//! random points:
//!
//! - a worker SIGKILLed (and replaced), alternately the one that started
//!   a handler last and the one that wrote last;
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
//! fenced write. After the fault phase the engine heals everything, the
//! run waits until every message is settled, and [judges](judge) the
//! ledger, the downstream, the store's records and the dead-letters: every
//! good message completed by the holder whose write the downstream holds,
//! no completed key claimed again, none lost, and dead-letters for the
//! poison messages only.
//!
//! An adapter's tests run it with [`run`] over their [`ChaosBroker`];
//! `scripts/chaos-consumers` runs the long version ([`ChaosPlan::from_env`]).

use std::net::SocketAddr;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::engine::{self, Clock, FaultPlan, Injected, Target};
use super::fault::{Fault, Link};
use super::report::{Findings, Report, Violation};
use crate::consumers::ledger::Work;
use crate::consumers::scenario::{spawn_worker, LEASE};
use crate::consumers::under_test::ChaosBroker;
use crate::doubles::proxy::FaultProxy;
use crate::servers::redis::RedisServer;

pub use super::judge::{judge, Evidence};

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
    /// The faults a consumer run injects by default: every kind, at both
    /// links (no `cut`s: a broker's protocol reconnects from those as from
    /// a reset).
    pub const FAULTS: [Fault; 11] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Leave,
        Fault::BrokerRestart,
        Fault::StoreRestart,
        Fault::Reset(Link::Broker),
        Fault::Latency(Link::Broker),
        Fault::Blackhole(Link::Broker),
        Fault::Reset(Link::Idem),
        Fault::Latency(Link::Idem),
        Fault::Blackhole(Link::Idem),
    ];

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
            faults: Self::FAULTS.to_vec(),
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
            self.faults =
                Fault::parse_list(&names).unwrap_or_else(|why| panic!("IDEM_CHAOS_FAULTS: {why}"));
        }
        self
    }

    /// When and what the engine injects.
    pub fn fault_plan(&self) -> FaultPlan {
        FaultPlan {
            seed: self.seed,
            faults: self.faults.clone(),
            fault_every: self.fault_every,
            duration: self.duration,
            settle_limit: self.settle_limit,
        }
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

/// Runs `plan` on broker `B`: see the [module](crate::chaos::consumers).
///
/// # Panics
///
/// When the run itself cannot be carried out (a server that does not
/// start): a test's failure, not a violation.
pub async fn run<B: ChaosBroker>(name: &str, plan: ChaosPlan) -> Report {
    let target = ConsumerRun::<B>::start_servers(name, &plan).await;
    match engine::run(&plan.fault_plan(), target, |_| {}).await {
        Ok(report) => report,
        Err(never) => match never {},
    }
}

/// A consumer run's servers, proxies, workers and workload.
struct ConsumerRun<B: ChaosBroker> {
    name: String,
    plan: ChaosPlan,
    broker: Option<B::Server>,
    redis: Option<RedisServer>,
    broker_proxy: FaultProxy,
    store_proxy: FaultProxy,
    /// The destination reached directly (the publisher, the judge).
    direct: B,
    messages: Vec<(String, String)>,
    good: Vec<String>,
    poison: Vec<String>,
    workers: Workers,
    restarting: Arc<AtomicBool>,
    published: Arc<AtomicUsize>,
    publisher: Option<JoinHandle<usize>>,
    /// Whether the next kill hits the worker that wrote last (else the
    /// one that started a handler last).
    kill_writer: bool,
    settle: Settle<B::Store>,
}

/// How far the run has settled after the fault phase.
struct Settle<S> {
    store: Option<S>,
    written: bool,
    all_final: bool,
    checked: Option<Instant>,
}

impl<B: ChaosBroker> ConsumerRun<B> {
    /// Starts the broker, the store (unless it lives on the broker's
    /// server) and a fault proxy in front of each.
    async fn start_servers(name: &str, plan: &ChaosPlan) -> Self {
        let mut rng = StdRng::seed_from_u64(plan.seed);
        let broker = tokio::task::spawn_blocking(B::start_server)
            .await
            .expect("broker task")
            .expect("a broker of the run's own");
        let redis = match B::store_port(&broker) {
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
        let broker_proxy = proxy(B::advertised_port(&broker).unwrap_or(0), B::port(&broker)).await;
        let store_proxy = proxy(0, store_port).await;
        let direct = B::create_at(name, B::port(&broker), &B::store_url(store_port)).await;
        let through = direct.through(
            broker_proxy.addr().port(),
            &B::store_url(store_proxy.addr().port()),
        );
        let messages = workload(plan, &mut rng);
        let mut poison: Vec<String> = messages
            .iter()
            .filter(|(_, body)| body.contains(r#""poison":true"#))
            .map(|(key, _)| key.clone())
            .collect();
        poison.sort();
        poison.dedup();
        let good = (0..plan.keys)
            .map(|i| format!("c-{i}"))
            .filter(|k| !poison.contains(k))
            .collect();
        Self {
            name: name.to_owned(),
            plan: plan.clone(),
            broker: Some(broker),
            redis,
            broker_proxy,
            store_proxy,
            direct,
            messages,
            good,
            poison,
            workers: Workers {
                env: through.env(),
                running: Vec::new(),
                leaving: Vec::new(),
                exits: 0,
            },
            restarting: Arc::new(AtomicBool::new(false)),
            published: Arc::new(AtomicUsize::new(0)),
            publisher: None,
            kill_writer: false,
            settle: Settle {
                store: None,
                written: false,
                all_final: false,
                checked: None,
            },
        }
    }
}

impl<B: ChaosBroker> Target for ConsumerRun<B> {
    type Error = std::convert::Infallible;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn faults(&self) -> Vec<Fault> {
        ChaosPlan::FAULTS
            .into_iter()
            .filter(|f| match f {
                Fault::BrokerRestart => B::RESTARTS,
                Fault::StoreRestart => self.redis.is_some(),
                _ => true,
            })
            .collect()
    }

    fn proxies(&self, link: Link) -> Vec<&FaultProxy> {
        match link {
            Link::Idem => vec![&self.store_proxy],
            Link::Broker => vec![&self.broker_proxy],
        }
    }

    async fn start(&mut self) -> Result<(), Self::Error> {
        for _ in 0..self.plan.workers {
            self.workers.spawn();
        }
        self.publisher = Some(tokio::spawn(publish_over(
            self.direct.clone(),
            self.messages.clone(),
            self.plan.duration,
            Arc::clone(&self.restarting),
            Arc::clone(&self.published),
        )));
        Ok(())
    }

    async fn step(&mut self, _clock: &Clock) -> Result<(), Self::Error> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.workers.replace_exited();
        Ok(())
    }

    async fn inject(
        &mut self,
        fault: Fault,
        clock: &Clock,
        rng: &mut StdRng,
    ) -> Result<Injected, Self::Error> {
        let ledger = self.direct.ledger();
        Ok(match fault {
            Fault::Kill => {
                // Alternately mid-handler and between an effect and its
                // acknowledgement.
                let busy = if self.kill_writer {
                    ledger.latest_writer()
                } else {
                    ledger.latest_starter()
                };
                self.kill_writer = !self.kill_writer;
                let slot = self.workers.slot_of(busy, rng);
                self.workers.kill(slot);
                Injected::Done
            }
            Fault::Stop => {
                let slot = self.workers.slot_of(ledger.latest_starter(), rng);
                let pause = LEASE.mul_f64(rng.random_range(1.5..3.0));
                match self.workers.stop(slot) {
                    Some(pid) => Injected::Stopped {
                        pid,
                        until: clock.now + pause,
                    },
                    None => Injected::Missed,
                }
            }
            Fault::Leave => {
                let slot = self.workers.slot_of(ledger.latest_starter(), rng);
                if self.workers.leave(slot) {
                    Injected::Done
                } else {
                    Injected::Missed
                }
            }
            Fault::BrokerRestart => {
                let Some(mut broker) = self.broker.take() else {
                    return Ok(Injected::Missed);
                };
                self.restarting.store(true, Ordering::SeqCst);
                self.broker = Some(
                    tokio::task::spawn_blocking(move || {
                        B::restart(&mut broker).expect("restart the broker");
                        broker
                    })
                    .await
                    .expect("restart task"),
                );
                self.restarting.store(false, Ordering::SeqCst);
                Injected::Done
            }
            Fault::StoreRestart => {
                let Some(mut server) = self.redis.take() else {
                    return Ok(Injected::Missed);
                };
                self.redis = Some(
                    tokio::task::spawn_blocking(move || {
                        server.stop();
                        server.start_again().expect("start the store again");
                        server
                    })
                    .await
                    .expect("restart task"),
                );
                Injected::Done
            }
            _ => Injected::Missed,
        })
    }

    fn resume(&mut self, pid: u32) {
        self.workers.resume(pid);
    }

    fn progress(&self) -> (usize, usize) {
        (self.published.load(Ordering::SeqCst), self.messages.len())
    }

    async fn settled(&mut self) -> bool {
        let now = Instant::now();
        if self
            .settle
            .checked
            .is_some_and(|at| now.duration_since(at) < Duration::from_millis(200))
        {
            return false;
        }
        self.settle.checked = Some(now);
        if !self.publisher.as_ref().is_none_or(JoinHandle::is_finished) {
            return false;
        }
        let ledger = self.direct.ledger();
        if !self.settle.written {
            self.settle.written = self.good.iter().all(|k| ledger.downstream(k).is_some());
            if !self.settle.written {
                return false;
            }
        }
        if self.settle.store.is_none() {
            self.settle.store = Some(self.direct.store().await);
        }
        let Some(store) = self.settle.store.as_ref() else {
            return false;
        };
        if !self.settle.all_final {
            self.settle.all_final =
                super::judge::records_final(store, &self.good, &self.poison).await;
            if !self.settle.all_final {
                return false;
            }
        }
        self.direct.settled(self.poison.len()).await
    }

    fn unsettled(&self, _clock: &Clock, limit: Duration) -> Vec<Violation> {
        vec![Violation::run(format!(
            "the run did not settle within {limit:?} of the fault phase's end (every good \
             key written: {}; every record completed or failed: {})",
            self.settle.written, self.settle.all_final
        ))]
    }

    async fn finish(&mut self) -> Result<Findings, Self::Error> {
        let published = match self.publisher.take() {
            Some(publisher) => publisher.await.expect("publisher task"),
            None => 0,
        };
        // Late duplicates and redeliveries show themselves before judging.
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.workers.stop_all();
        let store = match self.settle.store.take() {
            Some(store) => store,
            None => self.direct.store().await,
        };
        let ledger = self.direct.ledger();
        let evidence = Evidence::gather(ledger, &store, &self.good, &self.poison).await;
        let dead = self.direct.dead_letters().await;
        let violations = judge(&evidence, &dead, &self.poison)
            .into_iter()
            .map(Violation::run)
            .collect();
        let starts = evidence.starts.values().map(Vec::len).sum::<usize>();
        Ok(Findings {
            keys: self.plan.keys,
            counts: vec![
                ("published", published as u64),
                ("starts", starts as u64),
                ("stale", ledger.stale_writes() as u64),
                ("exits", self.workers.exits as u64),
            ],
            violations,
            ..Findings::default()
        })
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
    count: Arc<AtomicUsize>,
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
        count.store(published, Ordering::SeqCst);
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

/// An adapter's chaos test file: the worker process the run starts and
/// the short run, over the adapter's [`ChaosBroker`] `$setup`, its
/// destinations named after `$name`. The run's plan is
/// [`ChaosPlan::short`] changed by [`ChaosPlan::from_env`], and its report
/// table is printed (the long runs' table collects its row).
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
            let report = $crate::chaos::consumers::run::<$setup>($name, plan).await;
            println!(
                "\n{}",
                $crate::chaos::Report::tables(std::slice::from_ref(&report))
            );
            report.assert_clean();
        }
    };
}
