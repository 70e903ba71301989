//! # idem-sqlite: the embedded durable store
//!
//! The zero-server default for idem: one SQLite file in WAL mode. A
//! completion returned to the caller is on disk (fsynced) by default, and
//! concurrent callers share fsyncs: a single writer thread batches whatever
//! is queued into one transaction (group commit). Reads — and claims that
//! only find an outcome — are served from their own connections without
//! waiting for the writer. Several processes may share one file.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use idem::{Idempotency, Outcome, RecordId};
//! use idem_sqlite::SqliteStore;
//!
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("idem.db"))?;
//! let idem = Idempotency::builder(store).build()?;
//! let id = RecordId::parse("emails", "welcome:user-42")?;
//! let sent = idem.run(&id, None, |_| async { Ok::<_, std::io::Error>("sent".to_owned()) }).await?;
//! assert!(matches!(sent, Outcome::Executed { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! - **Durability:** [`Durability::Full`] by default; [`Durability::Normal`]
//!   trades the last acknowledged writes on an OS crash or power loss for
//!   speed (never on a process crash), as its docs say exactly.
//! - **Atomicity:** every primitive runs inside the writer's `BEGIN
//!   IMMEDIATE` transaction, deciding with `idem::machine` against the rows
//!   as that transaction sees them; other processes are excluded by
//!   SQLite's write lock (they wait up to the busy timeout).
//! - **Tokens and fences** come from a sequence kept in the file, so they
//!   are unique and rising for the life of the file, across processes and
//!   restarts.
//! - **Clocks:** leases are decided on the wall clock of the process that
//!   writes. A clock that jumps (or processes whose clocks disagree) makes
//!   leases end early or late — a takeover sooner than the lease, or a
//!   crashed worker's key waiting longer — but never lets a stale holder's
//!   completion through: that is decided by token and fence, not by time
//!   (`RELIABILITY.md`, `sqlite-lease` with clock jumps of up to three
//!   leases).
//! - **Threads:** concurrent writes are batched by one writer thread per
//!   store. A write with nothing else in flight, on a multi-threaded tokio
//!   runtime, commits on the caller's thread instead (saving two thread
//!   wake-ups; it waits up to the busy timeout if another process holds
//!   the write lock). Reads (`get`, `list`, the first look of a `claim`)
//!   are short indexed lookups on the caller's thread. Dropping the last
//!   clone waits for the writer's current batch, so nothing acknowledged
//!   is lost.
//! - **Transactional inbox:** [`inbox::Inbox`] writes the dedup record
//!   inside your own `rusqlite` transaction.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use idem::machine::{decide_claim, ClaimDecision, Fresh, Write};
use idem::{
    journal_of, ClaimMany, ClaimOutcome, ClaimParams, Clock, CompleteMany, Completion,
    DeleteRecord, DynStepJournal, Failure, FindAbandoned, GetRecord, KeyRules, Lease, LeaseToken,
    ListPage, ListQuery, ListRecords, PurgeExpired, PurgerHandle, Record, RecordId, Resolution,
    Resolved, Scope, StepBegin, StepEntry, StepJournal, Store, StoreError, SystemClock, Timestamp,
};
use parking_lot::Mutex;
use rusqlite::types::Value;
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot, Notify};

pub mod inbox;
mod row;
mod schema;
mod writer;

use schema::Role;
pub use schema::{migrations, Durability, Migration, OpenError, SCHEMA_VERSION};
use writer::{Done, Job, Op, WriteConnection, Writer};

/// The default busy timeout: how long a connection waits for another
/// process's write lock before reporting the store unavailable.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The default largest number of jobs committed in one transaction.
pub const DEFAULT_MAX_BATCH: usize = 512;
/// The default number of jobs that may wait for the writer.
pub const DEFAULT_QUEUE: usize = 8192;

/// The embedded durable store. Cloning is cheap; clones share the file,
/// the writer and the read connections. The writer stops (and the file is
/// checkpointed and closed) when the last clone is dropped.
pub struct SqliteStore<C: Clock = SystemClock> {
    inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for SqliteStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: Clock> std::fmt::Debug for SqliteStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("durability", &self.inner.durability)
            .finish_non_exhaustive()
    }
}

struct Inner<C> {
    jobs: Option<mpsc::Sender<Job>>,
    writer: Option<JoinHandle<()>>,
    /// The write connection, shared by the writer thread and idle callers.
    connection: Arc<Mutex<WriteConnection<C>>>,
    /// Writes submitted and not yet answered.
    in_flight: AtomicUsize,
    readers: Mutex<Vec<Connection>>,
    clock: Arc<C>,
    changed: Arc<Notify>,
    path: PathBuf,
    durability: Durability,
    busy: Duration,
}

impl<C> Drop for Inner<C> {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish its batch and exit.
        self.jobs.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// Configures and opens a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder<C: Clock = SystemClock> {
    path: PathBuf,
    clock: C,
    durability: Durability,
    busy: Duration,
    max_batch: usize,
    queue: usize,
}

impl SqliteStore<SystemClock> {
    /// Opens (creating if needed) the store file at `path` with the
    /// defaults: full durability, 5 s busy timeout, the system clock.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        Self::builder(path).open()
    }

    /// A builder for the store file at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder<SystemClock> {
        SqliteStoreBuilder {
            path: path.as_ref().to_path_buf(),
            clock: SystemClock,
            durability: Durability::Full,
            busy: DEFAULT_BUSY_TIMEOUT,
            max_batch: DEFAULT_MAX_BATCH,
            queue: DEFAULT_QUEUE,
        }
    }
}

impl<C: Clock> SqliteStoreBuilder<C> {
    /// Reads time from `clock` (a [`ManualClock`](idem::ManualClock) in
    /// tests). All processes sharing a file should use the same time source.
    pub fn clock<C2: Clock>(self, clock: C2) -> SqliteStoreBuilder<C2> {
        SqliteStoreBuilder {
            path: self.path,
            clock,
            durability: self.durability,
            busy: self.busy,
            max_batch: self.max_batch,
            queue: self.queue,
        }
    }

    /// What an acknowledged write survives (default [`Durability::Full`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How long to wait for another process's write lock.
    pub fn busy_timeout(mut self, busy: Duration) -> Self {
        self.busy = busy;
        self
    }

    /// The most jobs committed in one transaction (at least 1).
    pub fn max_batch(mut self, jobs: usize) -> Self {
        self.max_batch = jobs.max(1);
        self
    }

    /// How many jobs may wait for the writer before callers wait to
    /// enqueue (at least 1).
    pub fn queue(mut self, jobs: usize) -> Self {
        self.queue = jobs.max(1);
        self
    }

    /// Opens the file, migrating its schema, and starts the writer.
    pub fn open(self) -> Result<SqliteStore<C>, OpenError> {
        let (conn, store_id) = schema::retry_busy(self.busy, || {
            let mut conn = schema::connect(&self.path, self.durability, self.busy, Role::Writer)?;
            let store_id = schema::migrate(&mut conn, &self.path, self.busy)?;
            Ok((conn, store_id))
        })?;
        let (tx, rx) = mpsc::channel(self.queue);
        let clock = Arc::new(self.clock);
        let changed = Arc::new(Notify::new());
        let connection = Arc::new(Mutex::new(WriteConnection {
            conn,
            clock: Arc::clone(&clock),
            store_id,
        }));
        let writer = Writer {
            connection: Arc::clone(&connection),
            max_batch: self.max_batch,
            changed: Arc::clone(&changed),
        };
        let handle = std::thread::Builder::new()
            .name("idem-sqlite-writer".to_owned())
            .spawn(move || writer.run(rx))
            .map_err(|e| OpenError::Sqlite {
                path: self.path.clone(),
                source: rusqlite::Error::InvalidParameterName(format!(
                    "cannot start the writer thread: {e}"
                )),
            })?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                jobs: Some(tx),
                writer: Some(handle),
                connection,
                in_flight: AtomicUsize::new(0),
                readers: Mutex::new(Vec::new()),
                clock,
                changed,
                path: self.path,
                durability: self.durability,
                busy: self.busy,
            }),
        })
    }
}

/// Keys read back from the file were validated when written, under
/// whatever length limit the writer configured: only the character rule is
/// checked again.
fn stored_key_rules() -> KeyRules {
    KeyRules::default().max_len(std::num::NonZeroUsize::MAX)
}

/// Counts a write as in flight until dropped (also when its future is).
struct InFlight<'a> {
    count: &'a AtomicUsize,
    before: usize,
}

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        let before = count.fetch_add(1, Ordering::AcqRel);
        Self { count, before }
    }

    fn alone(&self) -> bool {
        self.before == 0
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

fn multi_threaded_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

fn writer_stopped() -> StoreError {
    StoreError::Unavailable("the idem-sqlite writer has stopped".into())
}

impl<C: Clock> SqliteStore<C> {
    /// The store file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn submit(&self, op: Op) -> Result<Done, StoreError> {
        // Inline commits and reads finish without ever waiting, so a loop of
        // store calls would otherwise never give its worker thread back to
        // the runtime: take part in tokio's cooperative budget instead.
        tokio::task::coop::consume_budget().await;
        let in_flight = InFlight::enter(&self.inner.in_flight);
        // Alone, on a multi-threaded runtime: commit on this thread rather
        // than crossing to the writer and back (two thread wake-ups). With
        // anything else in flight, queue for the writer so that concurrent
        // writes share a commit; on a current-thread runtime always queue,
        // as inline commits there would never overlap to share one.
        if in_flight.alone() && multi_threaded_runtime() {
            if let Some(mut connection) = self.inner.connection.try_lock() {
                let result = connection.execute(&[&op]);
                drop(connection);
                self.inner.changed.notify_waiters();
                return match result {
                    Ok(mut done) => done.pop().unwrap_or_else(|| Err(writer_stopped())),
                    Err(e) => Err(writer::store_error(&e)),
                };
            }
        }
        let (reply, answer) = oneshot::channel();
        let jobs = self.inner.jobs.as_ref().ok_or_else(writer_stopped)?;
        jobs.send(Job { op, reply })
            .await
            .map_err(|_| writer_stopped())?;
        answer.await.map_err(|_| writer_stopped())?
    }

    async fn write(&self, lease: &Lease, write: Write) -> Result<Timestamp, StoreError> {
        match self
            .submit(Op::Write {
                lease: lease.clone(),
                write,
            })
            .await?
        {
            Done::Write(result) => result,
            _ => unreachable!("a write job is answered with Done::Write"),
        }
    }

    /// Runs `f` on a read connection (WAL: it sees the last commit and never
    /// waits for the writer). A yield point under tokio's cooperative budget,
    /// as [`Self::submit`] is.
    async fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        tokio::task::coop::consume_budget().await;
        let conn = self.reader()?;
        let result = f(&conn);
        self.inner.readers.lock().push(conn);
        result.map_err(|e| writer::store_error(&e))
    }

    /// A reader from the pool, or a new one; give it back with
    /// `self.inner.readers.lock().push(conn)`.
    fn reader(&self) -> Result<Connection, StoreError> {
        let pooled = self.inner.readers.lock().pop();
        match pooled {
            Some(conn) => Ok(conn),
            None => schema::connect(
                &self.inner.path,
                self.inner.durability,
                self.inner.busy,
                Role::Reader,
            )
            .map_err(|e| StoreError::Unavailable(Box::new(e))),
        }
    }

    /// Whether `id` is in progress, as `conn` reads it now.
    fn busy(&self, conn: &Connection, id: &RecordId) -> bool {
        let now = self.inner.clock.now();
        matches!(
            row::load(conn, id),
            Ok(Some((_, Ok(Record { state: idem::State::InProgress { .. }, expires_at, .. })))) if now < expires_at
        )
    }

    /// Starts a background task (on the current tokio runtime) that purges
    /// expired records every `every`, at most `batch` per transaction so
    /// other writes are never held up for long (see [`idem::spawn_purger`]).
    /// Stops when the handle is dropped.
    pub fn spawn_purger(&self, every: Duration, batch: usize) -> PurgerHandle {
        idem::spawn_purger(self.clone(), every, batch)
    }
}

impl<C: Clock> Store for SqliteStore<C> {
    async fn peek(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        GetRecord::get(self, id).await
    }

    fn step_journal(&self) -> Option<Arc<dyn DynStepJournal>> {
        Some(journal_of(self.clone()))
    }

    fn local_now(&self) -> Option<Timestamp> {
        Some(self.inner.clock.now())
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        // A claim that will only report what is there (an outcome, a live
        // lease, a mismatch) is answered from a read snapshot: correct as of
        // that snapshot, and it never waits for the writer. Only claims that
        // may acquire go through the writer, which decides again under the
        // write lock.
        let now = self.inner.clock.now();
        if let Some((_, Ok(record))) = self.read(|conn| row::load(conn, id)).await? {
            let probe = Fresh {
                token: LeaseToken::from_u128(0),
                fence_floor: 0,
            };
            if let ClaimDecision::Answer(outcome) = decide_claim(Some(&record), params, now, probe)
            {
                return Ok(outcome);
            }
        }
        match self
            .submit(Op::Claim(vec![(id.clone(), params.clone())]))
            .await?
        {
            Done::Claims(mut outcomes) => outcomes.pop().unwrap_or_else(|| Err(writer_stopped())),
            _ => unreachable!("a claim job is answered with Done::Claims"),
        }
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.write(
            lease,
            Write::Complete {
                response,
                retention,
            },
        )
        .await
        .map(drop)
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.write(lease, Write::Fail { failure, retention })
            .await
            .map(drop)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        self.write(lease, Write::Extend { lease: duration }).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.write(lease, Write::Release).await.map(drop)
    }

    /// Woken by every commit of this store's writer. Commits by other
    /// processes (or other stores on the file) are seen through the file's
    /// change counter (`PRAGMA data_version` on a reader of the wait's
    /// own): it is read with a backoff from 5 to 100 ms, and the record
    /// only when it moved. The notification is registered before looking,
    /// so a commit between the caller's claim and this call is not missed.
    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        const FIRST: Duration = Duration::from_millis(5);
        const MAX: Duration = Duration::from_millis(100);
        let deadline = tokio::time::Instant::now() + timeout;
        let notified = self.inner.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Ok(conn) = self.reader() else {
            let _ = tokio::time::timeout(timeout, notified).await;
            return;
        };
        let version = |conn: &Connection| {
            conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .ok()
        };
        let mut seen = version(&conn);
        let mut delay = FIRST;
        if self.busy(&conn, id) {
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                tokio::select! {
                    () = &mut notified => break,
                    () = tokio::time::sleep(delay.min(left)) => {}
                }
                delay = (delay * 2).min(MAX);
                let now = version(&conn);
                if now != seen {
                    seen = now;
                    if !self.busy(&conn, id) {
                        break;
                    }
                }
            }
        }
        self.inner.readers.lock().push(conn);
    }
}

impl<C: Clock> GetRecord for SqliteStore<C> {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let now = self.inner.clock.now();
        match self.read(|conn| row::load(conn, id)).await? {
            None => Ok(None),
            Some((_, Ok(record))) => Ok((!record.is_expired(now)).then_some(record)),
            Some((_, Err(reason))) => Err(writer::corrupt(id, reason)),
        }
    }
}

impl<C: Clock> StepJournal for SqliteStore<C> {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let op = Op::BeginStep {
            lease: lease.clone(),
            step: step.to_owned(),
        };
        match self.submit(op).await? {
            Done::BeginStep(result) => result,
            _ => unreachable!("a begin_step job is answered with Done::BeginStep"),
        }
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let op = Op::FinishStep {
            lease: lease.clone(),
            step: step.to_owned(),
            result,
        };
        match self.submit(op).await? {
            Done::FinishStep(result) => result,
            _ => unreachable!("a finish_step job is answered with Done::FinishStep"),
        }
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let now = self.inner.clock.now();
        let (record, steps) = self
            .read(|conn| Ok((row::load(conn, id)?, row::load_steps(conn, id)?)))
            .await?;
        match record {
            Some((_, Ok(record))) if !record.is_expired(now) => Ok(steps),
            Some((_, Err(reason))) => Err(writer::corrupt(id, reason)),
            _ => Ok(Vec::new()),
        }
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let op = Op::Resolve {
            id: id.clone(),
            step: step.to_owned(),
            resolution,
        };
        match self.submit(op).await? {
            Done::Resolve(result) => result,
            _ => unreachable!("a resolve job is answered with Done::Resolve"),
        }
    }
}

impl<C: Clock> DeleteRecord for SqliteStore<C> {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        match self.submit(Op::Delete(id.clone())).await? {
            Done::Delete(live) => Ok(live),
            _ => unreachable!("a delete job is answered with Done::Delete"),
        }
    }
}

/// The SQL for one page and its values, with only the filters in use, so
/// SQLite seeks in the `(scope, key)` index instead of scanning from the
/// start on every page (`+expires_at` keeps the expiry index out of it).
/// `None` when the page is empty by construction (a cursor past the scope).
fn list_sql(query: &ListQuery, now: i64, limit: usize) -> Option<(String, Vec<Value>)> {
    let mut sql = String::from(concat!(
        "SELECT scope, key, ",
        row::columns!(),
        " FROM idem_records WHERE +expires_at > ?"
    ));
    let mut values = vec![Value::Integer(now)];
    if let Some(state) = query.state {
        sql.push_str(" AND state = ?");
        values.push(Value::Integer(row::state_code(state)));
    }
    let text = |s: &str| Value::Text(s.to_owned());
    match (&query.scope, &query.after) {
        (Some(scope), Some(after)) if after.scope() == scope => {
            sql.push_str(" AND scope = ? AND key > ?");
            values.extend([text(scope.as_str()), text(after.key().as_str())]);
        }
        (Some(scope), Some(after)) if after.scope() > scope => return None,
        (Some(scope), _) => {
            sql.push_str(" AND scope = ?");
            values.push(text(scope.as_str()));
        }
        (None, Some(after)) => {
            sql.push_str(" AND (scope, key) > (?, ?)");
            values.extend([text(after.scope().as_str()), text(after.key().as_str())]);
        }
        (None, None) => {}
    }
    sql.push_str(" ORDER BY scope, key LIMIT ?");
    values.push(Value::Integer(
        i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX),
    ));
    Some((sql, values))
}

impl<C: Clock> SqliteStore<C> {
    /// Runs a query selecting `scope, key, ` and the record's columns.
    async fn read_rows(
        &self,
        sql: &str,
        values: Vec<Value>,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let rows = self
            .read(|conn| {
                let mut stmt = conn.prepare_cached(sql)?;
                let rows = stmt.query_map(rusqlite::params_from_iter(values.iter()), |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        row::decode(r, 2),
                    ))
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await?;
        let mut records = Vec::with_capacity(rows.len());
        for (scope, key, record) in rows {
            let id = Scope::new(&scope)
                .and_then(|s| Ok(RecordId::new(s, stored_key_rules().parse(&key)?)))
                .map_err(|e| StoreError::Corrupt {
                    id: format!("{scope}/{key}"),
                    reason: e.to_string(),
                })?;
            let record = record.map_err(|reason| writer::corrupt(&id, reason))?;
            records.push((id, record));
        }
        Ok(records)
    }
}

/// Abandoned records of a scope, longest-abandoned first: `state = 0` is
/// written out so that SQLite walks the partial index of in-progress rows
/// (`0003_abandoned.sql`) in `lease_until` order.
const ABANDONED_SQL: &str = concat!(
    "SELECT scope, key, ",
    row::columns!(),
    " FROM idem_records WHERE state = 0 AND scope = ?1 AND lease_until <= ?2",
    " AND +expires_at > ?2 ORDER BY lease_until LIMIT ?3"
);

impl<C: Clock> FindAbandoned for SqliteStore<C> {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let now = row::millis(self.inner.clock.now());
        let values = vec![
            Value::Text(scope.as_str().to_owned()),
            Value::Integer(now),
            Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)),
        ];
        self.read_rows(ABANDONED_SQL, values).await
    }
}

impl<C: Clock> ListRecords for SqliteStore<C> {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let now = row::millis(self.inner.clock.now());
        let limit = query.limit.max(1);
        let Some((sql, values)) = list_sql(query, now, limit) else {
            return Ok(ListPage {
                records: Vec::new(),
                next: None,
            });
        };
        let mut records = self.read_rows(&sql, values).await?;
        let next = (records.len() > limit).then(|| records[limit - 1].0.clone());
        records.truncate(limit);
        Ok(ListPage { records, next })
    }
}

impl<C: Clock> PurgeExpired for SqliteStore<C> {
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        match self.submit(Op::Purge(limit)).await? {
            Done::Purge(n) => Ok(n),
            _ => unreachable!("a purge job is answered with Done::Purge"),
        }
    }
}

impl<C: Clock> ClaimMany for SqliteStore<C> {
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        match self.submit(Op::Claim(claims.to_vec())).await? {
            Done::Claims(outcomes) => Ok(outcomes),
            _ => unreachable!("a claim job is answered with Done::Claims"),
        }
    }
}

impl<C: Clock> CompleteMany for SqliteStore<C> {
    /// The completions go to the writer as one job, so they commit in one
    /// transaction with whatever else that batch carries.
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        match self.submit(Op::Complete(completions.to_vec())).await? {
            Done::Completes(written) => Ok(written),
            _ => unreachable!("a completion job is answered with Done::Completes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem::StateKind;

    fn plan(conn: &Connection, query: &ListQuery) -> String {
        let (sql, values) = list_sql(query, 0, 10).expect("a query");
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("prepare");
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values.iter()), |r| {
                r.get::<_, String>(3)
            })
            .expect("explain");
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows")
            .join("; ")
    }

    #[test]
    fn pages_seek_in_the_key_index_and_never_sort() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plan.db");
        let mut conn = schema::connect(&path, Durability::Full, DEFAULT_BUSY_TIMEOUT, Role::Writer)
            .expect("open");
        schema::migrate(&mut conn, &path, DEFAULT_BUSY_TIMEOUT).expect("migrate");
        let scope = Scope::new("s").expect("valid");
        let after = RecordId::parse("s", "k5").expect("valid");
        let queries = [
            ListQuery::new(10).after(after.clone()),
            ListQuery::new(10).scope(scope.clone()).after(after.clone()),
            ListQuery::new(10)
                .scope(scope.clone())
                .state(StateKind::Completed),
            ListQuery::new(10),
        ];
        for (i, query) in queries.iter().enumerate() {
            let plan = plan(&conn, query);
            assert!(!plan.contains("TEMP B-TREE"), "query {i} sorts: {plan}");
            assert!(
                !plan.contains("expires_at"),
                "query {i} walks the expiry index: {plan}"
            );
            if i < 3 {
                assert!(
                    plan.starts_with("SEARCH"),
                    "query {i} scans instead of seeking: {plan}"
                );
            }
        }
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {ABANDONED_SQL}"))
            .expect("prepare");
        let plan = stmt
            .query_map(rusqlite::params!["s", 0, 10], |r| r.get::<_, String>(3))
            .expect("explain")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows")
            .join("; ");
        assert!(
            plan.starts_with("SEARCH") && plan.contains("idem_records_abandoned"),
            "the abandoned query does not seek in its index: {plan}"
        );
        assert!(
            !plan.contains("TEMP B-TREE"),
            "the abandoned query sorts: {plan}"
        );
        let past = ListQuery::new(10)
            .scope(scope)
            .after(RecordId::parse("t", "k").expect("valid"));
        assert!(
            list_sql(&past, 0, 10).is_none(),
            "a cursor past the scope is an empty page"
        );
    }
}
