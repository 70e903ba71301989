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
//! - a worker told to leave cleanly (it finishes what it holds and
//!   commits), replaced once it has gone — every replacement takes its
//!   slot's member name ([`MEMBER_VAR`](crate::consumers::scenario::MEMBER_VAR)),
//!   which Kafka's workers use as their static group membership;
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
//! The run's [target](target) starts the servers and proxies, its
//! [`workers`] are the consumer processes and the publisher. An adapter's
//! tests run it with [`run`] over their [`ChaosBroker`];
//! `scripts/chaos-consumers` runs the long version ([`ChaosPlan::from_env`]).

mod judge;
mod target;
mod workers;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::engine::{self, FaultPlan};
use super::fault::{Fault, Link};
use super::report::Report;
use crate::consumers::ledger::{Hop, Work};
use crate::consumers::scenario::{self, PIPELINE_VAR};
use crate::consumers::under_test::ChaosBroker;
use target::ConsumerRun;

pub use judge::{judge, Evidence};

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
    /// Whether the run is a two-hop pipeline: each good message's run
    /// emits one message through the run outbox to a second destination,
    /// which the same workers consume with the fenced handler of their
    /// own (see [`ChaosPlan::pipeline`]).
    pub pipeline: bool,
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
            pipeline: false,
        }
    }

    /// The suite's pipeline run: [`short`](Self::short) with each good
    /// message's run emitting one message to a second destination on the
    /// same broker (the run outbox, its dispatcher in every worker), the
    /// second hop consumed by the same worker processes, kills aimed in
    /// turn also between a stored completion and its messages'
    /// confirmation and at the second hop. Judged at both hops: every
    /// good message completed once and fenced at the first, its run's one
    /// message (the stored run's, by id) completed once and fenced at the
    /// second, nothing else started there, none lost.
    /// It may take twice the consumer run's time to settle: two hops in
    /// series, each working off its own backlog.
    pub fn pipeline() -> Self {
        Self {
            pipeline: true,
            settle_limit: Duration::from_secs(240),
            ..Self::short()
        }
    }

    /// The plan with `IDEM_CHAOS_SECS`, `IDEM_CHAOS_SEED`,
    /// `IDEM_CHAOS_KEYS` and `IDEM_CHAOS_FAULTS` (fault names, comma
    /// separated: `kill,leave`) from the environment where set (a long
    /// run scales its keys with its duration unless told: 20 a second, 10
    /// for a pipeline).
    ///
    /// # Panics
    ///
    /// On a fault name it does not know, naming the known ones.
    pub fn from_env(mut self) -> Self {
        let var = |name: &str| std::env::var(name).ok()?.parse::<u64>().ok();
        if let Some(secs) = var("IDEM_CHAOS_SECS") {
            self.duration = Duration::from_secs(secs);
            // A pipeline's key is two deliveries, two records and a send.
            let per_second = if self.pipeline { 10 } else { 20 };
            self.keys = (secs as usize * per_second).max(self.keys);
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
    let mut target = ConsumerRun::<B>::start_servers(name, &plan).await;
    match engine::run(&plan.fault_plan(), &mut target, |_| {}).await {
        Ok(report) => report,
        Err(never) => match never {},
    }
}

/// The body of a chaos test file's ignored `worker_process` test:
/// consumes the setup its parent passed with the
/// [fenced handler](crate::consumers::ledger::fenced_handler) until it is
/// killed or told to leave; in a pipeline run (`PIPELINE_VAR` set) it
/// also emits through the run outbox and consumes the next hop
/// ([`ChaosBroker::output`]). Does nothing when the binary runs as a
/// plain test.
pub fn worker_process<B: ChaosBroker>() {
    let Some(setup) = B::from_env() else {
        return;
    };
    if std::env::var_os(PIPELINE_VAR).is_none() {
        scenario::worker_main(
            |shutdown| async move { setup.consume(Work::Fenced, shutdown).await },
        );
        return;
    }
    scenario::worker_main(|shutdown| async move {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
        });
        let until = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let output = setup.output();
        let hop = Hop {
            to: output.address(),
            sender: setup.sender().await,
        };
        tokio::join!(
            setup.consume(Work::Pipeline(hop), until(stopped.clone())),
            output.consume(Work::Fenced, until(stopped)),
        );
    });
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
            $crate::chaos::consumers::worker_process::<$setup>();
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

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[allow(clippy::print_stdout)]
        async fn faults_leave_each_piped_message_completed_once_at_both_hops_and_none_lost() {
            let plan = $crate::chaos::ChaosPlan::pipeline().from_env();
            let report =
                $crate::chaos::consumers::run::<$setup>(concat!($name, "-pipeline"), plan).await;
            println!(
                "\n{}",
                $crate::chaos::Report::tables(std::slice::from_ref(&report))
            );
            report.assert_clean();
        }
    };
}
