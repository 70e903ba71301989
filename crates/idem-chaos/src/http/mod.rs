//! HTTP runs: the gateway where users meet it, under faults.
//!
//! K client **processes** send a workload of N keys (a share of the
//! requests duplicates, some concurrent, some much later) through the fault
//! proxy to an `idem proxy` **process** (this crate's binary in gateway
//! mode, which runs the `idem` binary's own code), in front of an upstream
//! that applies each request's effect at once, appends it to an fsynced
//! ledger, and answers after a seeded delay. Clients retry with the same
//! key as API SDKs do (see [`client`]).
//!
//! Faults, seeded:
//!
//! - in the workload: client timeouts shorter than the upstream (the
//!   client gives up on the connection mid-request and retries), upstream
//!   answers slower than the gateway's upstream timeout, and upstream
//!   answers broken off midway;
//! - `kill`: the gateway SIGKILLed (by PID) with requests in flight, and
//!   started again on the same port after 0.1–0.5 s;
//! - `latency`, `blackhole`, `reset`, `cut` at the proxy between clients
//!   and gateway (answers delayed, held, connections reset, answers cut
//!   off midway).
//!
//! With `--reconcile={upstream}/reconcile` among the gateway's arguments,
//! keys whose outcome became unknown are settled by asking the upstream,
//! which answers from its ledger (applied, with the first execution's
//! answer, or not applied).
//!
//! After the fault phase every key gets one more request (after a lease,
//! so claims left by a dead gateway have run out), and the checker proves
//! for every key: the upstream executed it at most once; every client
//! that got a 2xx got that one execution's response; it ended completed,
//! or failed with an unknown outcome only where the gateway died while it
//! was in progress or the upstream broke its answer on purpose; and no
//! record is left in progress.

mod check;
pub mod client;
mod target;
mod upstream;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idem::key_hash::KeyHasher;
use idem::{GetRecord, Key, ListQuery, ListRecords, RecordId, Scope, StateKind};
use idem_cli::store::AnyStore;
use idem_testkit::chaos::{self, Progress, Report};
use idem_testkit::doubles::proxy::FaultProxy;
use idem_testkit::servers::postgres::PgServer;
use idem_testkit::servers::redis::RedisServer;
use idem_testkit::{free_port, ServerError};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::check::Violation;
use crate::error::{harness, ChaosError};
use crate::rundir::{keep_if_violated, run_dir};
use crate::{Plan, Target};
use check::{Answer, HttpTally};
use upstream::Upstream;

/// The scope the gateway gives the run's requests.
const SCOPE: &str = "http POST /charges";
/// Stands for the upstream's URL in the gateway's extra arguments
/// (`--reconcile={upstream}/reconcile`).
pub const UPSTREAM_PLACEHOLDER: &str = "{upstream}";
/// How long the gateway lets the upstream take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(1);

fn server(what: &'static str) -> impl FnOnce(ServerError) -> ChaosError {
    move |source| ChaosError::Server { what, source }
}

/// Runs `plan` (an HTTP target) and checks it.
pub(crate) async fn run(plan: &Plan, progress: impl Fn(Progress)) -> Result<Report, ChaosError> {
    let dir = run_dir("idem-chaos-http")?;
    let (store_server, store_url) = store_server(plan.target, &dir).await?;
    let upstream = Upstream::start(&dir.join("upstream.log")).await?;
    let port = free_port().map_err(server("gateway port"))?;
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into())
        .await
        .map_err(server("fault proxy"))?;
    let hasher = key_hasher(&plan.gateway_args)?;
    let mut run = Run::new(plan, dir.clone(), &store_url, (port, proxy), upstream);
    if let Some(hasher) = hasher {
        run.hash_keys(hasher)?;
    }
    let report = chaos::run(&plan.fault_plan(), &mut run, progress).await?;
    drop(run);
    drop(store_server);
    Ok(keep_if_violated(report, dir))
}

/// The server a target's store needs (none for SQLite): held for the
/// run, stopped when dropped.
type StoreServer = Box<dyn std::any::Any + Send>;

/// Starts the store `target` runs on; its server and URL.
async fn store_server(
    target: Target,
    dir: &std::path::Path,
) -> Result<(Option<StoreServer>, String), ChaosError> {
    let started = match target {
        Target::HttpRedis => tokio::task::spawn_blocking(|| {
            let redis = RedisServer::start_with(
                free_port()?,
                &["--appendonly", "yes", "--appendfsync", "always"],
            )?;
            let url = redis.url();
            Ok((Box::new(redis) as StoreServer, url))
        }),
        Target::HttpPostgres => tokio::task::spawn_blocking(|| {
            let pg = PgServer::start()?;
            let db = pg.create_database("chaos_http")?;
            let url = format!("{}?schema=chaos", pg.url(&db));
            Ok((Box::new(pg) as StoreServer, url))
        }),
        _ => return Ok((None, format!("sqlite:{}", dir.join("idem.db").display()))),
    };
    let (server_of, url) = started
        .await
        .map_err(harness)?
        .map_err(server("the store's server"))?;
    Ok((Some(server_of), url))
}

/// One request of the workload.
struct Job {
    key: usize,
    timeout_ms: u64,
    delay_ms: u64,
    fault: &'static str,
    /// `Prefer: wait=` this many seconds, if not 0.
    wait_s: u64,
    client: Option<usize>,
    answered: bool,
}

struct ClientProc {
    child: Child,
    stdin: ChildStdin,
    outstanding: HashSet<usize>,
}

struct GatewayProc {
    child: Child,
    pid: Pid,
}

/// The processes of a run, the workload and what came back.
struct Run {
    bin: PathBuf,
    dir: PathBuf,
    store_url: String,
    port: u16,
    lease: Duration,
    gateway_args: Vec<String>,
    upstream: Upstream,
    /// The fault proxy in front of the gateway, where the clients connect.
    proxy: FaultProxy,
    /// The gateway's store, opened at the start (to see what a killed
    /// gateway left in progress).
    store: Option<AnyStore>,
    workers: usize,
    inflight: usize,
    tick: Option<tokio::time::Interval>,
    /// When every key gets its settling request.
    settling_from: Option<Instant>,
    gateway: Option<GatewayProc>,
    gateways_started: u64,
    restart_at: Option<Instant>,
    clients: Vec<ClientProc>,
    events: mpsc::UnboundedReceiver<(usize, Option<String>)>,
    events_tx: mpsc::UnboundedSender<(usize, Option<String>)>,
    keys: Vec<String>,
    jobs: Vec<Job>,
    pending: VecDeque<usize>,
    published: usize,
    answered: usize,
    answers: Vec<Answer>,
    /// Keys in progress in the store right after a gateway was killed.
    in_doubt: BTreeSet<String>,
    report: HttpTally,
    target: Target,
    /// With the gateway's `--key-secret`: its hasher, and the key of each
    /// hash.
    stored: Option<(KeyHasher, HashMap<String, String>)>,
}

impl Run {
    fn new(
        plan: &Plan,
        dir: PathBuf,
        store_url: &str,
        (port, proxy): (u16, FaultProxy),
        upstream: Upstream,
    ) -> Self {
        let mut rng = StdRng::seed_from_u64(plan.seed);
        let order = plan.deliveries(&mut rng);
        let extra = order.len() - plan.keys;
        let jobs = order
            .into_iter()
            .map(|key| {
                // A third of the clients time out before the upstream
                // answers; a few answers come later than the gateway
                // waits, or break off midway.
                let timeout_ms = if rng.random_bool(0.35) {
                    rng.random_range(100..400)
                } else {
                    3_000
                };
                let roll = rng.random_range(0..100);
                let (delay_ms, fault) = match roll {
                    0..4 => (1_300, "slow"),
                    4..8 => (rng.random_range(20..300), "reset"),
                    _ => (rng.random_range(20..600), "none"),
                };
                // A third ask to be held while a duplicate runs.
                let wait_s = if rng.random_bool(0.3) { 2 } else { 0 };
                Job {
                    key,
                    timeout_ms,
                    delay_ms,
                    fault,
                    wait_s,
                    client: None,
                    answered: false,
                }
            })
            .collect::<Vec<_>>();
        let (events_tx, events) = mpsc::unbounded_channel();
        let report = HttpTally {
            requests: jobs.len() + plan.keys,
            duplicates: extra,
            ..HttpTally::default()
        };
        Self {
            bin: plan.worker_bin.clone(),
            dir,
            store_url: store_url.to_owned(),
            port,
            lease: plan.lease,
            gateway_args: plan.gateway_args.clone(),
            upstream,
            proxy,
            store: None,
            workers: plan.workers,
            inflight: plan.inflight,
            tick: None,
            settling_from: None,
            gateway: None,
            gateways_started: 0,
            restart_at: None,
            clients: Vec::new(),
            events,
            events_tx,
            keys: plan.key_names(),
            jobs,
            pending: VecDeque::new(),
            published: 0,
            answered: 0,
            answers: Vec::new(),
            in_doubt: BTreeSet::new(),
            report,
            target: plan.target,
            stored: None,
        }
    }

    fn gateway_port(&self) -> u16 {
        self.port
    }

    /// Starts a gateway process and waits until it accepts connections.
    async fn start_gateway(&mut self) -> Result<(), ChaosError> {
        let n = self.gateways_started;
        self.gateways_started += 1;
        let log = self.dir.join(format!("gateway-{n}.err"));
        let stderr = File::create(&log).map_err(harness)?;
        let upstream = format!("http://{}", self.upstream.addr());
        let listen = format!("127.0.0.1:{}", self.gateway_port());
        let lease = format!("{}ms", self.lease.as_millis());
        let timeout = format!("{}ms", UPSTREAM_TIMEOUT.as_millis());
        let child = Command::new(&self.bin)
            .arg("gateway")
            .args(["proxy", "--listen", &listen, "--upstream", &upstream])
            .args(["--store", &self.store_url, "--admin-listen", "off"])
            .args(["--lease", &lease, "--upstream-timeout", &timeout])
            .args(["--retention", "1h"])
            .args(
                self.gateway_args
                    .iter()
                    .map(|arg| arg.replace(UPSTREAM_PLACEHOLDER, &upstream)),
            )
            .env("IDEM_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| harness(format!("starting the gateway: {e}")))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| harness("a gateway without a PID"))?;
        self.gateway = Some(GatewayProc {
            child,
            pid: Pid::from_raw(pid),
        });
        let started = Instant::now();
        while tokio::net::TcpStream::connect(&listen).await.is_err() {
            if let Some(gateway) = self.gateway.as_mut() {
                if let Ok(Some(status)) = gateway.child.try_wait() {
                    return Err(harness(format!(
                        "the gateway exited at start ({status}); see {}",
                        log.display()
                    )));
                }
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err(harness("the gateway did not start listening within 20 s"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// SIGKILLs the gateway and notes which keys it left in progress.
    async fn kill_gateway(&mut self, store: &AnyStore) -> Result<(), ChaosError> {
        if let Some(mut gateway) = self.gateway.take() {
            let _ = gateway.child.kill().await;
        }
        self.note_in_progress(store).await
    }

    /// Notes every key in progress as in doubt. Called as the gateway is
    /// killed, and again just before a new one starts: every key in
    /// progress then is still the dead gateway's (no key is claimed while
    /// no gateway runs), including a claim it had sent that a PostgreSQL
    /// backend committed after the first look.
    async fn note_in_progress(&mut self, store: &AnyStore) -> Result<(), ChaosError> {
        let scope = Scope::new(SCOPE).map_err(harness)?;
        let mut query = ListQuery::new(1_000_000);
        query.state = Some(StateKind::InProgress);
        query.scope = Some(scope);
        let page = store.list(&query).await.map_err(harness)?;
        // Under --key-secret the store holds each key's hash.
        let clear = self.stored.as_ref().map(|(_, clear)| clear);
        self.in_doubt
            .extend(page.records.into_iter().map(|(id, _)| {
                let stored = id.key().to_string();
                clear
                    .and_then(|c| c.get(&stored).cloned())
                    .unwrap_or(stored)
            }));
        Ok(())
    }

    fn spawn_clients(&mut self, count: usize, gateway: &str) -> Result<(), ChaosError> {
        for slot in 0..count {
            let log = self.dir.join(format!("client-{slot}.err"));
            let stderr = File::create(&log).map_err(harness)?;
            let mut child = Command::new(&self.bin)
                .arg("http-client")
                .env(client::GATEWAY_ENV, gateway)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(stderr)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| harness(format!("starting a client: {e}")))?;
            let stdin = child.stdin.take().ok_or_else(|| harness("no stdin pipe"))?;
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| harness("no stdout pipe"))?;
            let events = self.events_tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let _ = events.send((slot, Some(line)));
                }
                let _ = events.send((slot, None));
            });
            self.clients.push(ClientProc {
                child,
                stdin,
                outstanding: HashSet::new(),
            });
        }
        Ok(())
    }

    /// Takes a client's answer line.
    fn take(&mut self, slot: usize, line: Option<String>) {
        let Some(line) = line else {
            self.report.violations.push(Violation {
                key: None,
                what: format!("client {slot} exited on its own"),
            });
            return;
        };
        let parts: Vec<&str> = line.split(' ').collect();
        let [tag, job, attempts, timeouts, status, exec, problem] = parts[..] else {
            return;
        };
        let (Ok(job), Ok(attempts), Ok(timeouts), Ok(status)) = (
            job.parse::<usize>(),
            attempts.parse::<u64>(),
            timeouts.parse::<u64>(),
            status.parse::<u16>(),
        ) else {
            return;
        };
        if tag != "R" {
            return;
        }
        if let Some(client) = self.clients.get_mut(slot) {
            client.outstanding.remove(&job);
        }
        let key = if job < self.jobs.len() {
            if std::mem::replace(&mut self.jobs[job].answered, true) {
                return;
            }
            self.keys[self.jobs[job].key].clone()
        } else {
            self.keys[job - self.jobs.len()].clone()
        };
        self.answered += 1;
        self.report.attempts += attempts;
        self.report.timeouts += timeouts;
        match status {
            0 => self.report.gave_up += 1,
            200..=299 => self.report.answered_ok += 1,
            _ => {}
        }
        let problem = (problem != "-").then(|| problem.to_owned());
        if problem.as_deref() == Some("outcome-unknown") {
            self.report.answered_unknown += 1;
        }
        self.answers.push(Answer {
            key,
            status,
            exec: exec.parse().ok(),
            problem,
        });
    }

    /// Sends ready jobs to clients with room.
    async fn dispatch(&mut self, inflight: usize) {
        while let Some(&job) = self.pending.front() {
            let Some(slot) = (0..self.clients.len())
                .filter(|&s| self.clients[s].outstanding.len() < inflight)
                .min_by_key(|&s| self.clients[s].outstanding.len())
            else {
                return;
            };
            self.pending.pop_front();
            let line = if job < self.jobs.len() {
                let j = &mut self.jobs[job];
                j.client = Some(slot);
                format!(
                    "J {job} {} {} {} {} {}\n",
                    self.keys[j.key], j.timeout_ms, j.delay_ms, j.fault, j.wait_s
                )
            } else {
                // The settling request of one key: patient, no fault.
                format!(
                    "J {job} {} 5000 0 none 0\n",
                    self.keys[job - self.jobs.len()]
                )
            };
            let client = &mut self.clients[slot];
            client.outstanding.insert(job);
            let _ = client.stdin.write_all(line.as_bytes()).await;
        }
    }

    /// A gateway that exited without being killed is a violation; it is
    /// started again.
    async fn watch_gateway(&mut self) -> Result<(), ChaosError> {
        let exited = match self.gateway.as_mut() {
            Some(gateway) => gateway.child.try_wait().map_err(harness)?,
            None => None,
        };
        if let Some(status) = exited {
            self.gateway = None;
            self.report.violations.push(Violation {
                key: None,
                what: format!("the gateway exited on its own ({status})"),
            });
            self.start_gateway().await?;
        }
        Ok(())
    }

    /// Stops the gateway as an operator would (SIGTERM: it finishes what
    /// is in flight) and the clients.
    async fn stop(&mut self) {
        if let Some(mut gateway) = self.gateway.take() {
            let _ = kill(gateway.pid, Signal::SIGTERM);
            let stopped = tokio::time::timeout(Duration::from_secs(15), gateway.child.wait()).await;
            if !matches!(stopped, Ok(Ok(status)) if status.success()) {
                self.report.violations.push(Violation {
                    key: None,
                    what: format!("the gateway did not stop cleanly on SIGTERM: {stopped:?}"),
                });
                let _ = gateway.child.kill().await;
            }
        }
        for mut client in self.clients.drain(..) {
            let _ = client.child.kill().await;
        }
    }

    /// Reads the store and the ledger and checks every key.
    async fn check(&mut self) -> Result<HttpTally, ChaosError> {
        let mut report = std::mem::take(&mut self.report);
        let store = self.store.take().ok_or_else(|| harness("no store open"))?;
        let executions = self.upstream.executions();
        report.executions = executions.values().map(|e| e.len() as u64).sum();
        let broken: HashSet<String> = self.upstream.broken().into_iter().collect();
        let mut answers: HashMap<&str, Vec<&Answer>> = HashMap::new();
        for answer in &self.answers {
            answers.entry(answer.key.as_str()).or_default().push(answer);
        }
        let scope = Scope::new(SCOPE).map_err(harness)?;
        let hasher = self.stored.as_ref().map(|(hasher, _)| hasher);
        for key in &self.keys {
            let id = RecordId::new(scope.clone(), Key::new(key).map_err(harness)?);
            // Where the gateway stored it: under its hash with --key-secret.
            let id = hasher.map_or(id.clone(), |h| h.hash(&id));
            let record = store.get(&id).await.map_err(harness)?;
            if let Some(idem::State::Failed { failure }) = record.as_ref().map(|r| &r.state) {
                if failure.class == idem::FailureClass::Unknown {
                    report.unknown_keys += 1;
                }
            }
            check::check_key(
                key,
                executions.get(key).map_or(&[][..], Vec::as_slice),
                answers.get(key.as_str()).map_or(&[][..], Vec::as_slice),
                record.as_ref(),
                self.in_doubt.contains(key) || broken.contains(key),
                &mut report.violations,
            );
        }
        let stray: Vec<&String> = executions
            .keys()
            .filter(|k| !answers.contains_key(k.as_str()))
            .collect();
        if !stray.is_empty() {
            report.violations.push(Violation {
                key: None,
                what: format!("executions of keys no client sent: {stray:?}"),
            });
        }
        Ok(report)
    }
}

impl Run {
    /// The gateway stores keys hashed by `hasher`: the checks find each
    /// key's record under its hash, and each hash's key.
    fn hash_keys(&mut self, hasher: KeyHasher) -> Result<(), ChaosError> {
        let scope = Scope::new(SCOPE).map_err(harness)?;
        let mut clear = HashMap::with_capacity(self.keys.len());
        for key in &self.keys {
            let id = RecordId::new(scope.clone(), Key::new(key).map_err(harness)?);
            clear.insert(hasher.hash(&id).key().to_string(), key.clone());
        }
        self.stored = Some((hasher, clear));
        Ok(())
    }
}

/// The gateway's key hasher, when its arguments give it `--key-secret`.
fn key_hasher(gateway_args: &[String]) -> Result<Option<KeyHasher>, ChaosError> {
    let mut args = gateway_args.iter();
    while let Some(arg) = args.next() {
        let path = match arg.strip_prefix("--key-secret") {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_owned()),
            Some("") => args.next().cloned(),
            _ => None,
        };
        if let Some(path) = path {
            return KeyHasher::from_file(path).map(Some).map_err(harness);
        }
    }
    Ok(None)
}
