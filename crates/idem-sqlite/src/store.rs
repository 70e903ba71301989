//! [`SqliteStore`] and its `impl Store`: reads on the caller's thread,
//! writes through the writer (or inline, alone on a quiet store: see
//! `traffic.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use idem::machine::{decide_claim, ClaimDecision, Fresh, Write};
use idem::store::{ClaimOutcome, ClaimParams, Lease, LeaseToken};
use idem::{
    Clock, Failure, PurgerHandle, Record, RecordId, Store, StoreError, SystemClock, Timestamp,
};
use parking_lot::Mutex;
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot, Notify};

use crate::durable::Durable;
use crate::encode;
use crate::errors::store_error;
use crate::jobs::{Done, Job, Op};
use crate::peek::Peek;
use crate::schema::{self, Durability, Role};
use crate::traffic::Traffic;
use crate::writer::WriteConnection;

/// The embedded durable store. Cloning is cheap; clones share the file,
/// the writer and the read connections. The writer stops (and the file is
/// checkpointed and closed) when the last clone is dropped.
pub struct SqliteStore<C: Clock = SystemClock> {
    pub(crate) inner: Arc<Inner<C>>,
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

/// What clones of a store share.
pub(crate) struct Inner<C> {
    pub(crate) jobs: Option<mpsc::Sender<Job>>,
    pub(crate) writer: Option<JoinHandle<()>>,
    /// The write connection, shared by the writer thread and idle callers.
    pub(crate) connection: Arc<Mutex<WriteConnection<C>>>,
    /// Writes submitted and not yet answered, and whether one may
    /// commit on its caller's thread.
    pub(crate) traffic: Traffic,
    /// Whether claims read their keys before going to the writer.
    pub(crate) peek: Peek,
    /// Commits numbered, and how far the log is synced.
    pub(crate) durable: Arc<Durable>,
    pub(crate) readers: Mutex<Vec<Connection>>,
    pub(crate) clock: Arc<C>,
    pub(crate) changed: Arc<Notify>,
    pub(crate) path: PathBuf,
    pub(crate) durability: Durability,
    pub(crate) busy: Duration,
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

pub(crate) fn writer_stopped() -> StoreError {
    StoreError::Unavailable("the idem-sqlite writer has stopped".into())
}

impl<C: Clock> SqliteStore<C> {
    /// The store file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// How many expired keys the file remembers
    /// ([`remember_expired`](crate::SqliteStoreBuilder::remember_expired)).
    pub async fn remembered(&self) -> Result<u64, StoreError> {
        self.read(crate::horizon::remembered).await
    }

    pub(crate) async fn submit(&self, op: Op) -> Result<Done, StoreError> {
        // Inline commits and reads finish without ever waiting, so a loop of
        // store calls would otherwise never give its worker thread back to
        // the runtime: take part in tokio's cooperative budget instead.
        tokio::task::coop::consume_budget().await;
        let in_flight = self.inner.traffic.enter();
        // Alone on a quiet store, with another worker to serve the rest:
        // commit on this thread rather than crossing to the writer and
        // back (two thread wake-ups). Otherwise queue for the writer, so
        // that concurrent writes share a commit (`traffic.rs` says why).
        if in_flight.inline() {
            if let Some(mut connection) = self.inner.connection.try_lock() {
                let number = self.inner.durable.begin()?;
                let result = connection.execute(&[&op]);
                drop(connection);
                self.inner.changed.notify_waiters();
                // This fsync covers the writer's batches committed before
                // this one too: it may answer before the syncer's.
                self.inner.durable.sync(number)?;
                return match result {
                    Ok(mut done) => done.pop().unwrap_or_else(|| Err(writer_stopped())),
                    Err(e) => Err(store_error(&e)),
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

    pub(crate) async fn write(&self, lease: &Lease, write: Write) -> Result<Timestamp, StoreError> {
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
    /// waits for the writer), and answers once what it read is synced
    /// (`durable.rs`). A yield point under tokio's cooperative budget,
    /// as [`Self::submit`] is.
    pub(crate) async fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        tokio::task::coop::consume_budget().await;
        let conn = self.reader()?;
        let result = f(&conn);
        self.inner.readers.lock().push(conn);
        let read = result.map_err(|e| store_error(&e))?;
        // What was read may be a commit whose fsync has not ended.
        self.inner.durable.settled().await?;
        Ok(read)
    }

    /// A reader from the pool, or a new one; give it back with
    /// `self.inner.readers.lock().push(conn)`.
    pub(crate) fn reader(&self) -> Result<Connection, StoreError> {
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
    pub(crate) fn busy(&self, conn: &Connection, id: &RecordId) -> bool {
        let now = self.inner.clock.now();
        matches!(
            encode::load(conn, id),
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
    idem::store_capabilities!(peek, steps);

    fn local_now(&self) -> Option<Timestamp> {
        Some(self.inner.clock.now())
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        // A claim that will only report what is there (an outcome, a live
        // lease, a mismatch) is answered from a read snapshot: correct as of
        // that snapshot, and it never waits for the writer. Only claims that
        // may acquire go through the writer, which decides again under the
        // write lock.
        // After a run of new keys, the read is skipped (`peek.rs`).
        let peek = &self.inner.peek;
        if peek.worth_it() {
            let now = self.inner.clock.now();
            if let Some((_, Ok(record))) = self.read(|conn| encode::load(conn, id)).await? {
                let probe = Fresh {
                    token: LeaseToken::from_u128(0),
                    fence_floor: 0,
                };
                if let ClaimDecision::Answer(outcome) =
                    decide_claim(Some(&record), params, now, probe)
                {
                    peek.saw(true);
                    return Ok(outcome);
                }
            }
        }
        let outcome = match self
            .submit(Op::Claim(vec![(id.clone(), params.clone())]))
            .await
        {
            Ok(Done::Claims(mut outcomes)) => {
                outcomes.pop().unwrap_or_else(|| Err(writer_stopped()))
            }
            Ok(_) => unreachable!("a claim job is answered with Done::Claims"),
            Err(e) => Err(e),
        };
        // Anything but a fresh lease counts as a key that was there; an
        // error too, so that while the writer fails (a full disk, a lock
        // held too long) the read still answers duplicates and replays.
        peek.saw(!matches!(outcome, Ok(ClaimOutcome::Acquired(_))));
        outcome
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
