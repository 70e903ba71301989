//! One worker process of a run: it reads deliveries from stdin, runs each
//! through idem against the store, records what it did in the ledger, and
//! answers the broker on stdout.
//!
//! The protocol is one line per message:
//!
//! - in: `D <delivery> <attempt> <key>`, or `C <ms>`: from now on the
//!   worker's wall clock (the one its store reads, where it reads one)
//!   runs `ms` milliseconds (signed) off the system's;
//! - out: `A <delivery> <attempt> executed|replayed` (acknowledge) or
//!   `N <delivery> <attempt> <retry_ms> <reason>` (redeliver later).
//!
//! In the lease modes the handler appends `start <key> <fence>` to its
//! ledger file (fsynced) before its effect, makes a fenced write to the
//! downstream table, appends `effect <key> <fence> applied|stale`, and
//! after the executor reports the completion stored, `done <key> <fence>`.
//! A completion refused because the lease was taken over appends
//! `lost <key> <fence>`. In the inbox mode the effect row and the inbox
//! record commit in one transaction, so the table is the ledger.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use idem::{
    Backoff, Clock, Context, Idempotency, InboxOutcome, Key, Outcome, RecordId, RunError, Scope,
    Store, Timestamp,
};
use idem_dynamodb::{client_for, DynamoStore};
use idem_mysql::MySqlStore;
use idem_postgres::inbox::Inbox;
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use idem_testkit::servers::moto::{ACCESS_KEY, REGION, SECRET_KEY};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_postgres::NoTls;

use crate::Target;

/// The scope every run's keys live in.
pub const SCOPE: &str = "chaos";

/// The environment variable with a worker's starting clock skew, in signed
/// milliseconds.
pub const SKEW_ENV: &str = "IDEM_CHAOS_SKEW_MS";

/// How long a store or database call may take before the worker gives up
/// on it (the delivery is then redelivered).
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// What a worker is told by the run, through its environment.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Which store and mode.
    pub target: Target,
    /// The store's URL (through the fault proxy), or SQLite's file.
    pub store_url: String,
    /// The database holding the downstream table (lease modes): direct,
    /// or through the fault proxy where the store has no server.
    pub downstream_url: String,
    /// The lease.
    pub lease: Duration,
    /// How many deliveries it works on at once.
    pub inflight: usize,
    /// Where its ledger file goes.
    pub ledger_dir: PathBuf,
}

const ENV: [&str; 6] = [
    "IDEM_CHAOS_TARGET",
    "IDEM_CHAOS_STORE",
    "IDEM_CHAOS_DOWNSTREAM",
    "IDEM_CHAOS_LEASE_MS",
    "IDEM_CHAOS_INFLIGHT",
    "IDEM_CHAOS_LEDGER",
];

impl WorkerConfig {
    /// The environment a worker process is started with.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let values = [
            self.target.name().to_owned(),
            self.store_url.clone(),
            self.downstream_url.clone(),
            self.lease.as_millis().to_string(),
            self.inflight.to_string(),
            self.ledger_dir.to_string_lossy().into_owned(),
        ];
        ENV.into_iter().zip(values).collect()
    }

    /// Reads the configuration a run put in the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
        let target = var(ENV[0])?;
        Ok(Self {
            target: Target::parse(&target).with_context(|| format!("unknown target {target:?}"))?,
            store_url: var(ENV[1])?,
            downstream_url: var(ENV[2])?,
            lease: Duration::from_millis(var(ENV[3])?.parse().context(ENV[3])?),
            inflight: var(ENV[4])?.parse().context(ENV[4])?,
            ledger_dir: var(ENV[5])?.into(),
        })
    }
}

/// A delivery as the broker sent it.
#[derive(Debug, Clone)]
struct Delivery {
    id: u64,
    attempt: u32,
    key: String,
}

impl Delivery {
    fn parse(line: &str) -> Option<Self> {
        let mut parts = line.split(' ');
        if parts.next()? != "D" {
            return None;
        }
        Some(Self {
            id: parts.next()?.parse().ok()?,
            attempt: parts.next()?.parse().ok()?,
            key: parts.next()?.to_owned(),
        })
    }

    fn ack(&self, outcome: &str) -> String {
        format!("A {} {} {outcome}\n", self.id, self.attempt)
    }

    fn nack(&self, retry: Duration, reason: &str) -> String {
        let reason: String = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        format!(
            "N {} {} {} {reason}\n",
            self.id,
            self.attempt,
            retry.as_millis()
        )
    }
}

/// The worker's fsynced, append-only ledger file.
#[derive(Debug, Clone)]
struct LedgerFile(Arc<Mutex<File>>);

impl LedgerFile {
    fn open(dir: &std::path::Path) -> anyhow::Result<Self> {
        let path = dir.join(format!("worker-{}.log", std::process::id()));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Self(Arc::new(Mutex::new(file))))
    }

    /// Appends `line` and waits until it is on disk.
    async fn append(&self, line: String) -> anyhow::Result<()> {
        let file = Arc::clone(&self.0);
        tokio::task::spawn_blocking(move || {
            let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
            file.write_all(format!("{line}\n").as_bytes())?;
            file.sync_data()
        })
        .await
        .context("ledger task")?
        .context("writing the ledger")
    }
}

/// Runs a worker until its stdin closes.
pub async fn main() -> anyhow::Result<()> {
    let config = WorkerConfig::from_env()?;
    let ledger = LedgerFile::open(&config.ledger_dir)?;
    let (out, mut lines) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = lines.recv().await {
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let clock = JumpingClock::default();
    if let Ok(skew) = std::env::var(SKEW_ENV) {
        clock.jump_to(
            skew.parse()
                .with_context(|| format!("{SKEW_ENV}={skew:?}"))?,
        );
    }
    let worker = Worker::connect(&config, ledger, clock.clone()).await?;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = stdin.next_line().await.context("reading stdin")? {
        if let Some(ms) = line.strip_prefix("C ") {
            clock.jump_to(
                ms.parse()
                    .with_context(|| format!("not a clock jump: {line:?}"))?,
            );
            continue;
        }
        let Some(delivery) = Delivery::parse(&line) else {
            anyhow::bail!("not a delivery: {line:?}");
        };
        let worker = worker.clone();
        let out = out.clone();
        tokio::spawn(async move {
            let answer = worker.process(&delivery).await;
            let _ = out.send(answer);
        });
    }
    drop(out);
    let _ = writer.await;
    Ok(())
}

/// The wall clock a worker's store reads: the system's, off by a signed
/// number of milliseconds the run sets (a clock fault).
#[derive(Debug, Clone, Default)]
struct JumpingClock(Arc<AtomicI64>);

impl JumpingClock {
    fn jump_to(&self, offset_ms: i64) {
        self.0.store(offset_ms, Ordering::Relaxed);
    }
}

impl Clock for JumpingClock {
    fn now(&self) -> Timestamp {
        let offset = self.0.load(Ordering::Relaxed);
        let by = Duration::from_millis(offset.unsigned_abs());
        if offset >= 0 {
            Timestamp::now().saturating_add(by)
        } else {
            Timestamp::now().saturating_sub(by)
        }
    }
}

/// A worker's connections.
#[derive(Clone)]
enum Worker {
    Lease(Arc<LeaseWorker>),
    Inbox(Arc<InboxWorker>),
}

impl Worker {
    async fn connect(
        config: &WorkerConfig,
        ledger: LedgerFile,
        clock: JumpingClock,
    ) -> anyhow::Result<Self> {
        let lease_store = |idem| {
            anyhow::Ok(Worker::Lease(Arc::new(LeaseWorker {
                idem,
                downstream: pool(&config.downstream_url, config.inflight)?,
                ledger: ledger.clone(),
            })))
        };
        Ok(match config.target {
            Target::PgLease => {
                let store = retry_open("connecting to PostgreSQL", || async {
                    let builder = PgStore::builder(&config.store_url)?
                        .pool_size(config.inflight)
                        .connect_timeout(CALL_TIMEOUT)
                        .response_timeout(CALL_TIMEOUT)
                        .setup(false);
                    Ok(builder.connect().await?)
                })
                .await?;
                lease_store(Guard::Pg(executor(store, config.lease)?))?
            }
            Target::RedisLease | Target::RedisClusterLease => {
                let store = retry_open("connecting to Redis", || async {
                    let builder = RedisStore::builder(&config.store_url)?
                        .connect_timeout(CALL_TIMEOUT)
                        .response_timeout(CALL_TIMEOUT);
                    Ok(builder.connect().await?)
                })
                .await?;
                lease_store(Guard::Redis(executor(store, config.lease)?))?
            }
            Target::SqliteLease => {
                // Opening takes the file's write lock for a moment, which a
                // worker stopped inside a transaction holds for longer
                // than the busy timeout.
                let what = format!("opening {}", config.store_url);
                let store = retry_open(&what, || {
                    let builder = SqliteStore::builder(&config.store_url)
                        .clock(clock.clone())
                        .busy_timeout(CALL_TIMEOUT);
                    async { Ok(tokio::task::spawn_blocking(move || builder.open()).await??) }
                })
                .await?;
                lease_store(Guard::Sqlite(executor(store, config.lease)?))?
            }
            Target::DynamoLease => {
                let (endpoint, table) = config
                    .store_url
                    .split_once('#')
                    .context("the DynamoDB URL is ENDPOINT#TABLE")?;
                let client = client_for(Some(endpoint), REGION, ACCESS_KEY, SECRET_KEY, None)?;
                // The store's calls give up as the others' do, so a
                // blackhole fails them in time to redeliver.
                let timeouts = TimeoutConfig::builder()
                    .connect_timeout(CALL_TIMEOUT)
                    .operation_attempt_timeout(CALL_TIMEOUT)
                    .operation_timeout(CALL_TIMEOUT * 2)
                    .build();
                let sdk = client
                    .config()
                    .to_builder()
                    .timeout_config(timeouts)
                    .build();
                let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(sdk), table)
                    .with_clock(clock);
                lease_store(Guard::Dynamo(executor(store, config.lease)?))?
            }
            Target::MySqlLease => {
                let store = retry_open("connecting to MySQL", || async {
                    let builder = MySqlStore::builder(&config.store_url)?
                        .pool_size(config.inflight)
                        .connect_timeout(CALL_TIMEOUT)
                        .response_timeout(CALL_TIMEOUT)
                        .setup(false);
                    Ok(builder.connect().await?)
                })
                .await?;
                lease_store(Guard::MySql(executor(store, config.lease)?))?
            }
            Target::PgInbox => Worker::Inbox(Arc::new(InboxWorker {
                pool: pool(&config.store_url, config.inflight)?,
                inbox: Inbox::new(Duration::from_secs(3600)),
            })),
            Target::HttpSqlite | Target::HttpRedis | Target::HttpPostgres => {
                anyhow::bail!("{} has no workers", config.target.name())
            }
        })
    }

    async fn process(&self, delivery: &Delivery) -> String {
        match self {
            Worker::Lease(w) => match &w.idem {
                Guard::Pg(idem) => w.process(idem, delivery).await,
                Guard::Redis(idem) => w.process(idem, delivery).await,
                Guard::Sqlite(idem) => w.process(idem, delivery).await,
                Guard::Dynamo(idem) => w.process(idem, delivery).await,
                Guard::MySql(idem) => w.process(idem, delivery).await,
            },
            Worker::Inbox(w) => w.process(delivery).await,
        }
    }
}

/// The executor for a lease-mode worker: retries are the broker's job, so
/// no attempt limit turns a run of faults into a terminal failure.
fn executor<S: Store>(store: S, lease: Duration) -> anyhow::Result<Idempotency<S>> {
    Idempotency::builder(store)
        .lease(lease)
        .heartbeat(lease / 4)
        .max_attempts(NonZeroU32::MAX)
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
        ))
        .build()
        .context("executor configuration")
}

/// Opens the store, trying again every 250 ms for 15 s while it fails: a
/// replacement worker may start while the store restarts, or (SQLite)
/// while a stopped worker holds the file's write lock.
async fn retry_open<S, F, Fut>(what: &str, mut open: F) -> anyhow::Result<S>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<S>>,
{
    let mut last = None;
    for _ in 0..60 {
        match open().await {
            Ok(store) => return Ok(store),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last.map_or_else(|| anyhow::anyhow!("{what}"), |e| e.context(what.to_owned())))
}

/// A pool of plain connections (not through idem's store).
fn pool(url: &str, size: usize) -> anyhow::Result<Pool> {
    let mut config: tokio_postgres::Config = url.parse().context("database URL")?;
    config.connect_timeout(CALL_TIMEOUT);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(CALL_TIMEOUT))
        .wait_timeout(Some(CALL_TIMEOUT))
        .build()
        .context("connection pool")
}

/// Runs `work` on a pooled connection under the call timeout. A
/// connection that failed or timed out is thrown away, not pooled again.
async fn on_connection<T, F>(pool: &Pool, work: F) -> anyhow::Result<T>
where
    F: AsyncFnOnce(&mut Object) -> anyhow::Result<T>,
{
    let mut client = pool.get().await.context("no connection")?;
    match tokio::time::timeout(CALL_TIMEOUT * 2, work(&mut client)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            drop(Object::take(client));
            Err(e)
        }
        Err(_) => {
            drop(Object::take(client));
            anyhow::bail!("the database did not answer in time")
        }
    }
}

/// Which executor a lease-mode worker has.
enum Guard {
    Pg(Idempotency<PgStore>),
    Redis(Idempotency<RedisStore>),
    Sqlite(Idempotency<SqliteStore<JumpingClock>>),
    Dynamo(Idempotency<DynamoStore>),
    MySql(Idempotency<MySqlStore>),
}

struct LeaseWorker {
    idem: Guard,
    downstream: Pool,
    ledger: LedgerFile,
}

/// Why a lease-mode handler failed (retryable: the broker redelivers).
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
struct HandlerError(anyhow::Error);

impl LeaseWorker {
    async fn process<S: Store>(&self, idem: &Idempotency<S>, delivery: &Delivery) -> String {
        let Ok(key) = Key::new(&delivery.key) else {
            return delivery.nack(Duration::from_secs(1), "invalid key");
        };
        let id = RecordId::new(Scope::new(SCOPE).expect("a valid scope"), key);
        let fence = AtomicU64::new(0);
        let result = idem
            .run(&id, None, |ctx: Context| {
                let f = ctx.fence().unwrap_or(0);
                fence.store(f, Ordering::Relaxed);
                async move { self.effect(&delivery.key, f).await.map_err(HandlerError) }
            })
            .await;
        let fence = fence.load(Ordering::Relaxed);
        match result {
            Ok(Outcome::Executed { .. }) => {
                match self
                    .ledger
                    .append(format!("done {} {fence}", delivery.key))
                    .await
                {
                    Ok(()) => delivery.ack("executed"),
                    Err(e) => delivery.nack(Duration::ZERO, &format!("{e:#}")),
                }
            }
            Ok(Outcome::Replayed { .. }) => delivery.ack("replayed"),
            Ok(Outcome::Unguarded { .. }) => delivery.ack("unguarded"),
            Err(RunError::LeaseLost) => {
                let _ = self
                    .ledger
                    .append(format!("lost {} {fence}", delivery.key))
                    .await;
                delivery.nack(Duration::from_millis(50), "lease lost")
            }
            Err(e) => {
                let retry = e.retry_after().unwrap_or(Duration::from_millis(100));
                let mut reason = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    reason.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                delivery.nack(retry.min(Duration::from_secs(1)), &reason)
            }
        }
    }

    /// The handler: a fenced write to the downstream table, between two
    /// ledger lines and short pauses (so faults land inside the handler
    /// and between the effect and the completion).
    async fn effect(&self, key: &str, fence: u64) -> anyhow::Result<u64> {
        self.ledger.append(format!("start {key} {fence}")).await?;
        pause().await;
        let fence_sql = i64::try_from(fence).context("fence out of range")?;
        let pid = i64::from(std::process::id());
        let applied = on_connection(&self.downstream, async |client: &mut Object| {
            let rows = client
                .query(
                    "INSERT INTO chaos_downstream AS d (key, fence, pid, writes) \
                     VALUES ($1, $2, $3, 1) \
                     ON CONFLICT (key) DO UPDATE \
                     SET fence = excluded.fence, pid = excluded.pid, writes = d.writes + 1 \
                     WHERE d.fence < excluded.fence RETURNING writes",
                    &[&key, &fence_sql, &pid],
                )
                .await?;
            Ok(!rows.is_empty())
        })
        .await?;
        let verdict = if applied { "applied" } else { "stale" };
        self.ledger
            .append(format!("effect {key} {fence} {verdict}"))
            .await?;
        pause().await;
        Ok(fence)
    }
}

/// A few milliseconds of "work".
async fn pause() {
    let ms = rand::random_range(0..15u64);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

struct InboxWorker {
    pool: Pool,
    inbox: Inbox,
}

impl InboxWorker {
    /// The effect row and the inbox record in one transaction.
    async fn process(&self, delivery: &Delivery) -> String {
        let Ok(key) = Key::new(&delivery.key) else {
            return delivery.nack(Duration::from_secs(1), "invalid key");
        };
        let id = RecordId::new(Scope::new(SCOPE).expect("a valid scope"), key);
        let inbox = &self.inbox;
        let result = on_connection(&self.pool, async |client: &mut Object| {
            let tx = client.transaction().await?;
            let outcome = match inbox.claim(&tx, &id, None).await? {
                InboxOutcome::New => {
                    let pid = i64::from(std::process::id());
                    tx.execute(
                        "INSERT INTO chaos_effects (key, pid) VALUES ($1, $2)",
                        &[&delivery.key, &pid],
                    )
                    .await?;
                    pause().await;
                    inbox
                        .set_response(&tx, &id, pid.to_string().as_bytes())
                        .await?;
                    "executed"
                }
                InboxOutcome::Duplicate { .. } => "replayed",
                InboxOutcome::Mismatch => anyhow::bail!("fingerprint mismatch"),
            };
            tx.commit().await?;
            Ok(outcome)
        })
        .await;
        match result {
            Ok(outcome) => delivery.ack(outcome),
            Err(e) => delivery.nack(Duration::from_millis(100), &format!("{e:#}")),
        }
    }
}
