//! Fault-injection runs: proof that idem's exactly-once claims hold while
//! processes die, stall and lose their store (docs/design.md §12).
//!
//! A run starts its own store (PostgreSQL or Redis, as child processes on
//! loopback) behind the project's TCP fault proxy, and K worker
//! **processes** (this crate's binary in worker mode). A small broker in
//! the run hands them a shared workload of N keys, a share of the
//! deliveries being duplicates, with at-least-once semantics: a delivery
//! is redelivered when its worker dies, asks for a retry, or holds it past
//! a visibility timeout. While it runs, faults are injected at seeded
//! random points:
//!
//! - SIGKILL of a worker (it is replaced), mid-handler or anywhere else;
//! - SIGSTOP of a worker for longer than its lease, then SIGCONT: a stale
//!   holder that wakes up and tries to finish;
//! - a store restart (PostgreSQL immediate shutdown with crash recovery,
//!   Redis SIGKILL with an fsync-always append-only file);
//! - network faults at the proxy: latency, a blackhole (a partition that
//!   heals), a reset of every connection, responses cut off midway;
//! - a worker's wall clock jumping forward or back by more than a lease,
//!   where the store reads the worker's clock (SQLite; PostgreSQL and
//!   Redis decide on the server's clock, so no worker clock reaches them).
//!
//! When the broker has every delivery acknowledged, a [checker](Report)
//! compares the workers' ledger, the downstream table and the store. The
//! modes ([`Target`]) and what each must show:
//!
//! - **`pg-inbox`**, the transactional inbox: the effect row commits with
//!   the inbox record, so every key has exactly one effect.
//! - **`pg-lease`, `redis-lease`, `sqlite-lease`**, the lease executor: a
//!   handler can run again after a crash, so effects are fenced writes.
//!   Every key is completed, by the holder with the highest fence that
//!   ever started it; at most one completion per key is acknowledged, and
//!   it is the one stored (none lost to a restart); the downstream row
//!   holds the accepted holder's write, stale holders' writes were
//!   refused; no live lease is left. SQLite has no server: the workers
//!   share one file, its "restart" is every worker SIGKILLed at once (mid
//!   commit, with writes from all of them in flight), and the proxy's
//!   network faults hit the workers' connections to the downstream
//!   database instead.
//! - **`redis-cluster-lease`**, the lease executor on a Redis Cluster of
//!   three masters with a replica each, every node behind its own fault
//!   proxy (the nodes announce the proxies' ports, so redirections and
//!   replication go through them too). Its "restart" is a master
//!   SIGKILLed, its replica promoted at once and the dead node replaced
//!   by a new, empty replica; slots also move between masters under load
//!   ([`Fault::Migrate`]). Redis replicates asynchronously, so the
//!   workers' writes wait for a replica ([`Plan::replica_acks`]); with
//!   that off, completions lost in failovers are what the checker counts.
//! - **`mysql-lease`**, the lease executor on MariaDB (the `idem-mysql`
//!   store): its "restart" is a SIGKILL of `mariadbd` (InnoDB crash
//!   recovery on the next start); leases are decided by the server's
//!   clock, so no worker clock reaches it.
//! - **`dynamodb-lease`**, the lease executor on DynamoDB (moto, one
//!   request at a time as DynamoDB's conditional writes need): DynamoDB's
//!   conditions compare times from the client's clock, so each worker runs
//!   with its own clock skew (up to half a lease either way) besides the
//!   clock jumps. Not restarted: moto keeps everything in memory, and a
//!   restart would lose every record, which DynamoDB never does.
//!
//! - **`http-sqlite`, `http-redis`, `http-postgres`**, the gateway (see [`http`]): client
//!   processes retrying as API SDKs do through the fault proxy to an
//!   `idem proxy` process that is SIGKILLed and restarted, in front of an
//!   upstream with a ledger. Every key executed at most once, every 2xx is
//!   that execution's response, no key left in progress, an unknown
//!   outcome only where the gateway died mid-request or the upstream broke
//!   its answer.
//!
//! `scripts/chaos` runs the long version; `tests/short.rs` a short one.

//!
//! Every target is a [`Target`](idem_testkit::chaos::Target) of the
//! test kit's one fault engine, which the broker adapters' runs share:
//! one vocabulary of faults ([`Fault`]), one schedule, one [`Report`].

mod check;
mod error;
mod evidence;
pub mod http;
mod rundir;
mod servers;
pub mod worker;
mod workers;

use std::path::PathBuf;
use std::time::Duration;

pub use error::ChaosError;
pub use idem_testkit::chaos::{Fault, FaultPlan, Link, Progress, Report, Violation};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// Runs `plan` and checks it; `progress` is called a few times a second.
pub async fn run(plan: &Plan, progress: impl Fn(Progress)) -> Result<Report, ChaosError> {
    plan.validate()?;
    if plan.target.is_http() {
        http::run(plan, progress).await
    } else {
        workers::run(plan, progress).await
    }
}

/// The store and the mode a run exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// PostgreSQL's transactional inbox: effect and dedup record commit
    /// together.
    PgInbox,
    /// The lease executor on the PostgreSQL store.
    PgLease,
    /// The lease executor on the Redis store.
    RedisLease,
    /// The lease executor on a Redis Cluster of three masters with a
    /// replica each, failed over and resharded under load.
    RedisClusterLease,
    /// The lease executor on one SQLite file shared by the worker
    /// processes.
    SqliteLease,
    /// The lease executor on DynamoDB (moto), workers' clocks skewed.
    DynamoLease,
    /// The lease executor on the MySQL store, on MariaDB.
    MySqlLease,
    /// The HTTP gateway (`idem proxy`) on the embedded SQLite store.
    HttpSqlite,
    /// The HTTP gateway on Redis.
    HttpRedis,
    /// The HTTP gateway on PostgreSQL.
    HttpPostgres,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 10] = [
        Target::PgInbox,
        Target::PgLease,
        Target::RedisLease,
        Target::RedisClusterLease,
        Target::SqliteLease,
        Target::DynamoLease,
        Target::MySqlLease,
        Target::HttpSqlite,
        Target::HttpRedis,
        Target::HttpPostgres,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Target::PgInbox => "pg-inbox",
            Target::PgLease => "pg-lease",
            Target::RedisLease => "redis-lease",
            Target::RedisClusterLease => "redis-cluster-lease",
            Target::SqliteLease => "sqlite-lease",
            Target::DynamoLease => "dynamodb-lease",
            Target::MySqlLease => "mysql-lease",
            Target::HttpSqlite => "http-sqlite",
            Target::HttpRedis => "http-redis",
            Target::HttpPostgres => "http-postgres",
        }
    }

    /// The target called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Whether the store decides leases on the worker's own wall clock
    /// (rather than the server's), so a clock fault reaches it.
    pub fn reads_worker_clock(self) -> bool {
        matches!(self, Target::SqliteLease | Target::DynamoLease)
    }

    /// Whether each worker starts with a clock skewed from the others' (up
    /// to half a lease either way): stores whose writes are conditioned
    /// on times from several clients' clocks.
    pub fn skews_worker_clocks(self) -> bool {
        self == Target::DynamoLease
    }

    /// The faults a run of this target injects by default: every kind
    /// that reaches it.
    pub fn faults(self) -> Vec<Fault> {
        let mut kinds = vec![Fault::Kill];
        if !self.is_http() {
            kinds.push(Fault::Stop);
            if self != Target::DynamoLease {
                // moto keeps its tables in memory only.
                kinds.push(Fault::StoreRestart);
            }
        }
        kinds.extend(Fault::on_link(Link::Idem));
        if self.reads_worker_clock() {
            kinds.push(Fault::Clock);
        }
        if self == Target::RedisClusterLease {
            kinds.push(Fault::Migrate);
        }
        if self.on_postgres() {
            kinds.push(Fault::Locks);
        }
        kinds
    }

    /// The distinct keys a second of faults carries by default: what the
    /// target settles within the harness's settle limit on two cores.
    /// DynamoDB's is half the others': moto serves one request at a time.
    pub fn keys_per_second(self) -> usize {
        if self == Target::DynamoLease {
            50
        } else {
            100
        }
    }

    /// The deliveries (HTTP targets: requests) each worker has in flight
    /// by default. An HTTP client waits on each request, retries
    /// included, so the HTTP targets need many more at once to carry the
    /// same workload.
    pub fn inflight(self) -> usize {
        if self.is_http() {
            64
        } else {
            8
        }
    }

    /// Whether this is a run of workers whose idem store is PostgreSQL.
    pub fn on_postgres(self) -> bool {
        matches!(self, Target::PgInbox | Target::PgLease)
    }

    /// Whether this is a run of the HTTP gateway (see [`http`]) rather
    /// than of workers behind a broker.
    pub fn is_http(self) -> bool {
        matches!(
            self,
            Target::HttpSqlite | Target::HttpRedis | Target::HttpPostgres
        )
    }
}

/// What a run does. [`Plan::new`] gives a short run; the fields say what
/// to change.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Store and mode.
    pub target: Target,
    /// Seeds the workload order and every fault: the same seed injects the
    /// same faults at the same offsets (what they hit depends on timing).
    pub seed: u64,
    /// Distinct keys.
    pub keys: usize,
    /// The share of deliveries that are duplicates of another, in
    /// `[0, 0.95]`.
    pub duplicates: f64,
    /// Worker processes.
    pub workers: usize,
    /// Deliveries each worker works on at once.
    pub inflight: usize,
    /// The executor's lease (lease modes).
    pub lease: Duration,
    /// How long deliveries are published and faults injected.
    pub duration: Duration,
    /// The mean time between faults.
    pub fault_every: Duration,
    /// Which faults to inject (by default [`Target::faults`]).
    pub faults: Vec<Fault>,
    /// How long the run may take to settle after the fault phase before
    /// undelivered keys count as lost.
    pub settle_limit: Duration,
    /// Whether Redis keeps an fsync-always append-only file (the
    /// default). Without it a Redis restart loses every record, which the
    /// checker must report: that is how the suite shows it can fail.
    pub redis_append_only: bool,
    /// Whether the Cluster target's writes wait for a replica's
    /// acknowledgement (`replicas=1`, the default). Without it a failover
    /// can lose acknowledged completions, which the checker reports: the
    /// measure of what the option buys.
    pub replica_acks: bool,
    /// The `idem-chaos` binary, started in worker mode.
    pub worker_bin: PathBuf,
    /// More `idem proxy` arguments for the gateway of an HTTP run (none by
    /// default); `{upstream}` in them stands for the upstream's URL.
    pub gateway_args: Vec<String>,
}

impl Plan {
    /// A short run of `target`: 300 keys, a third of the deliveries
    /// duplicates, 4 workers, a 1 s lease, every fault about every 400 ms
    /// for 8 s.
    pub fn new(target: Target, worker_bin: impl Into<PathBuf>) -> Self {
        Self {
            target,
            seed: 1,
            keys: 300,
            duplicates: 0.33,
            workers: 4,
            inflight: 8,
            lease: Duration::from_secs(1),
            duration: Duration::from_secs(8),
            fault_every: Duration::from_millis(400),
            faults: target.faults(),
            settle_limit: Duration::from_secs(60),
            redis_append_only: true,
            replica_acks: true,
            worker_bin: worker_bin.into(),
            gateway_args: Vec::new(),
        }
    }

    /// When and what the fault engine injects.
    pub fn fault_plan(&self) -> FaultPlan {
        FaultPlan {
            seed: self.seed,
            faults: self.faults.clone(),
            fault_every: self.fault_every,
            duration: self.duration,
            settle_limit: self.settle_limit,
        }
    }

    /// The keys' names, by index.
    pub fn key_names(&self) -> Vec<String> {
        (0..self.keys).map(|i| format!("k{i:06}")).collect()
    }

    /// The workload in publishing order, as key indexes: every key once
    /// and a share of [`Plan::duplicates`] more (rounded, so a share of
    /// 0.33 of 300 keys gives 148 duplicates), shuffled by `rng`.
    pub fn deliveries(&self, rng: &mut StdRng) -> Vec<usize> {
        let extra = ((self.keys as f64) * self.duplicates / (1.0 - self.duplicates)).round();
        let mut order: Vec<usize> = (0..self.keys).collect();
        order.extend((0..extra as usize).map(|_| rng.random_range(0..self.keys)));
        order.shuffle(rng);
        order
    }

    /// Why the plan makes no sense, if it does not.
    pub fn validate(&self) -> Result<(), ChaosError> {
        let bad = |why: &str| Err(ChaosError::Plan(why.to_owned()));
        if self.keys == 0 || self.workers == 0 || self.inflight == 0 {
            return bad("keys, workers and inflight must be at least 1");
        }
        if !(0.0..=0.95).contains(&self.duplicates) {
            return bad("duplicates is a share of deliveries between 0 and 0.95");
        }
        if self.lease < Duration::from_millis(200) {
            return bad("the lease must be at least 200ms");
        }
        if self.fault_every.is_zero() || self.duration.is_zero() {
            return bad("duration and fault_every must be positive");
        }
        if !self.worker_bin.is_file() {
            return Err(ChaosError::Plan(format!(
                "worker binary {} not found (build it with cargo build -p idem-chaos)",
                self.worker_bin.display()
            )));
        }
        Ok(())
    }
}
