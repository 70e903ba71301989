//! The writer: one thread, one connection, group commit.
//!
//! Callers queue jobs on a bounded channel. The writer blocks for the first
//! job (so an idle store adds no latency), takes whatever else is already
//! queued up to the batch limit, and runs the whole batch in one
//! `BEGIN IMMEDIATE` transaction: one commit, one fsync. Each job decides
//! with the pure state machine against the rows as the transaction sees
//! them. Answers are sent only after the commit and its fsync, so an
//! acknowledged write is as durable as the commit; at full durability,
//! with another batch queued, the fsync is the syncer thread's and the
//! writer commits that batch while it runs (`durable.rs`). If the commit
//! fails, every job in the batch gets the error and nothing of the batch is
//! kept.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::machine::{
    decide_claim, decide_resolve, decide_step_begin, decide_write, held, Fresh, Write,
};
use idem::store::{ClaimOutcome, ClaimParams, Lease, LeaseToken, StepBegin};
use idem::{Clock, RecordId, Resolution, Resolved, State, StepState, StoreError, Timestamp};
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, Notify};

use crate::durable::Durable;
use crate::encode::{self, Place, Writes};
use crate::errors::{corrupt, store_error};
use crate::expiry;
use crate::horizon;
use crate::jobs::{Done, Job, Op};
use crate::recent::Recent;
use crate::syncer::{self, Answers, Committed};

/// The write connection and what a transaction needs. Held under a lock
/// by the writer thread for each batch, or by an idle caller for its own
/// job (see `SqliteStore::submit`).
pub(crate) struct WriteConnection<C> {
    pub(crate) conn: Connection,
    pub(crate) clock: Arc<C>,
    pub(crate) site: Site,
    /// The in-progress records this connection wrote (see [`Recent`]).
    pub(crate) recent: Recent,
}

/// What every job of a store's file needs to know of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site {
    /// The store's id: the high half of every token.
    pub(crate) store_id: u64,
    /// How long expired keys are remembered ([`idem::horizon`]), if at all.
    pub(crate) memory: Option<Duration>,
}

pub(crate) struct Writer<C> {
    pub(crate) connection: Arc<Mutex<WriteConnection<C>>>,
    pub(crate) max_batch: usize,
    pub(crate) changed: Arc<Notify>,
    pub(crate) durable: Arc<Durable>,
}

impl<C: Clock> Writer<C> {
    /// Runs until every sender is gone, then returns (closing the
    /// connection, which checkpoints the log) once every batch is answered.
    pub(crate) fn run(self, mut jobs: mpsc::Receiver<Job>) {
        std::thread::scope(|scope| {
            let (to_syncer, committed) = std::sync::mpsc::channel();
            let syncer = self.durable.deferred().then(|| {
                std::thread::Builder::new()
                    .name("idem-sqlite-syncer".to_owned())
                    .spawn_scoped(scope, || syncer::run(&self.durable, committed))
            });
            // Without a syncer thread the batches are answered here.
            let to_syncer = match syncer {
                Some(Ok(_)) => Some(to_syncer),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "idem-sqlite: no syncer thread; the writer syncs each batch itself");
                    None
                }
                None => None,
            };
            let mut batch = Vec::with_capacity(self.max_batch);
            while let Some(first) = jobs.blocking_recv() {
                batch.push(first);
                while batch.len() < self.max_batch {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let committed = self.commit(&mut batch);
                self.changed.notify_waiters();
                // The syncer is worth its hand-off only with a next batch
                // to commit while it syncs; otherwise the writer syncs.
                let hand_off = to_syncer.as_ref().filter(|_| !jobs.is_empty());
                match (hand_off, committed) {
                    (Some(to_syncer), Ok(committed)) => {
                        if let Err(unsent) = to_syncer.send(committed) {
                            unsent.0.answer(&Err(crate::durable::broken()));
                        }
                    }
                    (None, Ok(committed)) => {
                        let synced = self.durable.sync(committed.number);
                        committed.answer(&synced);
                    }
                    (_, Err(answers)) => {
                        for (reply, done) in answers {
                            let _ = reply.send(done);
                        }
                    }
                }
            }
        });
    }

    /// Runs `batch` in one transaction. `Ok` holds the answers that wait
    /// for the log's fsync, `Err` those that are sent at once (the store
    /// refused the batch before it began).
    fn commit(&self, batch: &mut Vec<Job>) -> Result<Committed, Answers> {
        let mut connection = self.connection.lock();
        let number = match self.durable.begin() {
            Ok(number) => number,
            Err(_) => {
                return Err(batch
                    .drain(..)
                    .map(|job| (job.reply, Err(crate::durable::broken())))
                    .collect())
            }
        };
        let ops: Vec<&Op> = batch.iter().map(|job| &job.op).collect();
        let result = connection.execute(&ops);
        drop(connection);
        let answers = match result {
            Ok(done) => batch.drain(..).map(|job| job.reply).zip(done).collect(),
            Err(e) => {
                tracing::warn!(error = %e, jobs = batch.len(), "idem-sqlite batch failed; nothing of it was kept");
                batch
                    .drain(..)
                    .map(|job| (job.reply, Err(store_error(&e))))
                    .collect()
            }
        };
        Ok(Committed { number, answers })
    }
}

impl<C: Clock> WriteConnection<C> {
    /// Runs `ops` in one `BEGIN IMMEDIATE` transaction and commits.
    ///
    /// The batch first runs without savepoints. A job failing with a SQL
    /// error (a value too big, say) is rare; when it happens the whole
    /// transaction is rolled back and the batch runs again with each job in
    /// its own savepoint, so that the failure answers only its own job.
    /// Nothing of the first run was committed, and every job is decided
    /// afresh in the second, so no answer is given twice.
    pub(crate) fn execute(
        &mut self,
        ops: &[&Op],
    ) -> rusqlite::Result<Vec<Result<Done, StoreError>>> {
        let first = if ops.len() == 1 {
            // A lone job needs no savepoint: its failure is the batch's.
            Isolation::None
        } else {
            Isolation::Optimistic
        };
        match self.transaction(ops, first) {
            Ok(done) => Ok(done),
            Err(JobsError::Job(_)) => self
                .transaction(ops, Isolation::Savepoints)
                .map_err(JobsError::into_inner),
            Err(e) => Err(e.into_inner()),
        }
    }

    fn transaction(
        &mut self,
        ops: &[&Op],
        isolation: Isolation,
    ) -> Result<Vec<Result<Done, StoreError>>, JobsError> {
        // Statements are cached: parsing `BEGIN`/`COMMIT` and the sequence
        // queries for every batch showed up in the writer's profile.
        let conn = &self.conn;
        let recent = &mut self.recent;
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let result = recent
            .check(conn)
            .map_err(JobsError::Sql)
            .and_then(|()| run_jobs(conn, ops, isolation, self.clock.as_ref(), self.site, recent))
            .and_then(|done| {
                conn.prepare_cached("COMMIT")?.execute([])?;
                Ok(done)
            });
        if result.is_err() {
            // What the batch kept was not committed.
            recent.clear();
        }
        if result.is_err() && !conn.is_autocommit() {
            // Best effort: if even the rollback fails, SQLite rolls back
            // when the connection next begins, and the error reported is
            // the one that caused this.
            let _ = conn
                .prepare_cached("ROLLBACK")
                .and_then(|mut s| s.execute([]));
        }
        result
    }
}

/// How jobs in one transaction are kept apart.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// A lone job.
    None,
    /// No savepoints; a job's SQL failure aborts the batch for a rerun.
    Optimistic,
    /// Each job in its own savepoint.
    Savepoints,
}

/// Why a batch's transaction did not commit.
enum JobsError {
    /// A job's own statement failed (rerun the batch with savepoints).
    Job(rusqlite::Error),
    /// The transaction itself failed.
    Sql(rusqlite::Error),
}

impl JobsError {
    fn into_inner(self) -> rusqlite::Error {
        match self {
            JobsError::Job(e) | JobsError::Sql(e) => e,
        }
    }
}

impl From<rusqlite::Error> for JobsError {
    fn from(e: rusqlite::Error) -> Self {
        JobsError::Sql(e)
    }
}

/// Runs the jobs in the open transaction and stores the advanced sequence.
fn run_jobs<C: Clock>(
    conn: &Connection,
    ops: &[&Op],
    isolation: Isolation,
    clock: &C,
    site: Site,
    recent: &mut Recent,
) -> Result<Vec<Result<Done, StoreError>>, JobsError> {
    let start: i64 = conn
        .prepare_cached("SELECT value FROM idem_meta WHERE name = 'seq'")?
        .query_row([], |r| r.get(0))?;
    // A sequence that went backwards would reissue tokens: refuse it.
    let mut seq =
        u64::try_from(start).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(0, start))?;
    let mut done = Vec::with_capacity(ops.len());
    let mut writes = Writes::new(conn);
    for op in ops {
        if isolation != Isolation::Savepoints {
            match apply(&mut writes, op, clock.now(), site, &mut seq, recent) {
                Ok(answer) => done.push(Ok(answer)),
                Err(e) if isolation == Isolation::Optimistic && !conn.is_autocommit() => {
                    return Err(JobsError::Job(e))
                }
                Err(e) => return Err(JobsError::Sql(e)),
            }
            continue;
        }
        conn.prepare_cached("SAVEPOINT job")?.execute([])?;
        match apply(&mut writes, op, clock.now(), site, &mut seq, recent) {
            Ok(answer) => {
                conn.prepare_cached("RELEASE job")?.execute([])?;
                done.push(Ok(answer));
            }
            // Unless SQLite rolled the whole transaction back (which fails
            // the batch), the failure answers only its own job; what it
            // kept of its records was rolled back with it.
            Err(e) if !conn.is_autocommit() => {
                recent.clear();
                conn.prepare_cached("ROLLBACK TO job")?.execute([])?;
                conn.prepare_cached("RELEASE job")?.execute([])?;
                done.push(Err(store_error(&e)));
            }
            Err(e) => return Err(JobsError::Sql(e)),
        }
    }
    if i64::try_from(seq).ok() != Some(start) {
        conn.prepare_cached("UPDATE idem_meta SET value = ?1 WHERE name = 'seq'")?
            .execute([i64::try_from(seq).unwrap_or(i64::MAX)])?;
    }
    Ok(done)
}

/// Runs one job inside the batch's transaction. `Err` is a SQL failure of
/// this job; answers such as a lost lease are inside `Ok`.
fn apply(
    writes: &mut Writes<'_>,
    op: &Op,
    now: Timestamp,
    site: Site,
    seq: &mut u64,
    recent: &mut Recent,
) -> rusqlite::Result<Done> {
    let tx = writes.conn();
    Ok(match op {
        Op::Claim(claims) => {
            let mut outcomes = Vec::with_capacity(claims.len());
            for (id, params) in claims {
                outcomes.push(claim(writes, id, params, now, site, seq, recent)?);
            }
            Done::Claims(outcomes)
        }
        Op::Write { lease, write } => {
            Done::Write(apply_write(writes, lease, write.clone(), now, recent)?)
        }
        Op::Complete(completions) => {
            let mut written = Vec::with_capacity(completions.len());
            for c in completions {
                let write = Write::Complete {
                    response: c.response.clone(),
                    retention: c.retention,
                };
                written.push(apply_write(writes, &c.lease, write, now, recent)?.map(drop));
            }
            Done::Completes(written)
        }
        Op::Delete(id) => {
            // With a memory, an expired record is left to the purge, which
            // remembers it; deleting it here would forget its key.
            let live_only = site.memory.is_some();
            recent.forget(id);
            let expires: Option<i64> = tx
                .prepare_cached(
                    "DELETE FROM idem_records WHERE scope = ?1 AND key = ?2 \
                     AND (NOT ?3 OR expires_at > ?4) RETURNING expires_at",
                )?
                .query_row(
                    params![
                        id.scope().as_str(),
                        id.key().as_str(),
                        live_only,
                        encode::millis(now)
                    ],
                    |r| r.get(0),
                )
                .optional()?;
            Done::Delete(expires.is_some_and(|e| e > encode::millis(now)))
        }
        Op::Purge(limit) => {
            // A purge deletes by expiry, whichever rows those are.
            recent.clear();
            Done::Purge(match site.memory {
                None => expiry::delete(tx, now, *limit)?,
                Some(memory) => horizon::purge_remembering(tx, *limit, now, memory)?,
            })
        }
        Op::BeginStep { lease, step } => Done::BeginStep(begin_step(tx, lease, step, now, recent)?),
        Op::FinishStep {
            lease,
            step,
            result,
        } => Done::FinishStep(finish_step(tx, lease, step, result, now, recent)?),
        Op::Resolve {
            id,
            step,
            resolution,
        } => {
            recent.forget(id);
            Done::Resolve(resolve(writes, id, step, resolution.clone(), now)?)
        }
    })
}

/// The record of `lease` if the lease still holds it; `Err` answers the
/// caller (lost lease, corrupt row).
fn held_by(
    conn: &Connection,
    lease: &Lease,
    now: Timestamp,
    recent: &Recent,
) -> rusqlite::Result<Result<(), StoreError>> {
    if let Some(record) = recent.get(&lease.id) {
        return Ok(held(Some(record), lease.token, now)
            .map(drop)
            .map_err(StoreError::from));
    }
    Ok(match encode::load(conn, &lease.id)? {
        None => Err(StoreError::LeaseLost),
        Some((_, Err(reason))) => Err(corrupt(&lease.id, reason)),
        Some((_, Ok(record))) => held(Some(&record), lease.token, now)
            .map(drop)
            .map_err(StoreError::from),
    })
}

fn begin_step(
    conn: &Connection,
    lease: &Lease,
    step: &str,
    now: Timestamp,
    recent: &Recent,
) -> rusqlite::Result<Result<StepBegin, StoreError>> {
    if let Err(e) = held_by(conn, lease, now, recent)? {
        return Ok(Err(e));
    }
    let existing = encode::load_step(conn, &lease.id, step)?;
    let (write, begun) = decide_step_begin(existing.as_ref(), lease.attempt);
    if let Some(state) = write {
        encode::store_step(conn, &lease.id, step, &state)?;
    }
    Ok(Ok(begun))
}

fn finish_step(
    conn: &Connection,
    lease: &Lease,
    step: &str,
    result: &Bytes,
    now: Timestamp,
    recent: &Recent,
) -> rusqlite::Result<Result<(), StoreError>> {
    if let Err(e) = held_by(conn, lease, now, recent)? {
        return Ok(Err(e));
    }
    let done = StepState::Done {
        result: result.clone(),
    };
    encode::store_step(conn, &lease.id, step, &done)?;
    Ok(Ok(()))
}

fn resolve(
    writes: &mut Writes<'_>,
    id: &RecordId,
    step: &str,
    resolution: Resolution,
    now: Timestamp,
) -> rusqlite::Result<Result<Resolved, StoreError>> {
    let conn = writes.conn();
    let (rowid, record) = match encode::load(conn, id)? {
        None => return Ok(Ok(Resolved::NotParked)),
        Some((_, Err(reason))) => return Ok(Err(corrupt(id, reason))),
        Some((rowid, Ok(record))) => (rowid, record),
    };
    let current = encode::load_step(conn, id, step)?;
    let (next, step_state) = match decide_resolve(Some(&record), current.as_ref(), resolution, now)
    {
        Ok(decided) => decided,
        Err(why) => return Ok(Ok(why)),
    };
    match step_state {
        Some(state) => encode::store_step(conn, id, step, &state)?,
        None => {
            conn.prepare_cached(
                "DELETE FROM idem_steps WHERE scope = ?1 AND key = ?2 AND name = ?3",
            )?
            .execute(params![id.scope().as_str(), id.key().as_str(), step])?;
        }
    }
    writes.store(id, Place::Row(rowid), &next)?;
    Ok(Ok(Resolved::Released))
}

fn claim(
    writes: &mut Writes<'_>,
    id: &RecordId,
    params: &ClaimParams,
    now: Timestamp,
    site: Site,
    seq: &mut u64,
    recent: &mut Recent,
) -> rusqlite::Result<Result<ClaimOutcome, StoreError>> {
    let conn = writes.conn();
    let next = *seq + 1;
    let fresh = Fresh {
        token: LeaseToken::from_parts(site.store_id, next),
        fence_floor: next,
    };
    let remembered = match site.memory {
        Some(_)
            if idem::horizon::remembered_scope(id.scope().as_str())
                && !recent.horizon_empty(conn)? =>
        {
            horizon::recall(conn, id)?
        }
        _ => None,
    };
    // Most claims are first deliveries: try the machine's answer for an
    // absent key first, and read the row only if the key is taken (or
    // remembered: then whether it is still held decides).
    let (write, outcome) = decide_claim(None, params, now, fresh).into_parts(id);
    let first = write.expect("an absent key is always acquired");
    if remembered.is_none() && writes.store(id, Place::NewIfAbsent, &first)? {
        *seq = next;
        recent.keep(id, conn.last_insert_rowid(), first);
        return Ok(Ok(outcome));
    }
    // The key was taken: whatever is kept for it is older than the row.
    recent.forget(id);
    let (rowid, existing) = match encode::load(conn, id)? {
        Some((rowid, Ok(record))) => (Some(rowid), Some(record)),
        Some((_, Err(reason))) => return Ok(Err(corrupt(id, reason))),
        None => (None, None),
    };
    let (write, outcome) = decide_claim(existing.as_ref(), params, now, fresh).into_parts(id);
    let Some(record) = write else {
        return Ok(Ok(outcome));
    };
    if let (Some(memory), 1) = (site.memory, record.attempt) {
        let late = idem::horizon::late_retry(
            id,
            existing.as_ref(),
            remembered.as_ref(),
            params,
            now,
            memory,
        );
        if let Some(late) = late {
            return Ok(Ok(late));
        }
    }
    match rowid {
        Some(rowid) => {
            if record.attempt == 1 {
                // A new record where an expired one was: its journal goes too.
                encode::delete_steps(conn, id)?;
            }
            writes.store(id, Place::Row(rowid), &record)?;
        }
        None => {
            writes.store(id, Place::NewIfAbsent, &record)?;
        }
    }
    *seq = next;
    Ok(Ok(outcome))
}

fn apply_write(
    writes: &mut Writes<'_>,
    lease: &Lease,
    write: Write,
    now: Timestamp,
    recent: &mut Recent,
) -> rusqlite::Result<Result<Timestamp, StoreError>> {
    let conn = writes.conn();
    let kept = recent.take(&lease.id);
    let (rowid, existing) = match kept {
        Some(kept) => kept,
        None => match encode::load(conn, &lease.id)? {
            None => return Ok(Err(StoreError::LeaseLost)),
            Some((rowid, Ok(record))) => (rowid, record),
            Some((_, Err(reason))) => return Ok(Err(corrupt(&lease.id, reason))),
        },
    };
    match decide_write(Some(&existing), lease.token, write, now) {
        Ok(next) => {
            writes.store(&lease.id, Place::Held(rowid), &next)?;
            Ok(Ok(match next.state {
                State::InProgress { lease_until, .. } => {
                    recent.keep(&lease.id, rowid, next);
                    lease_until
                }
                _ => now,
            }))
        }
        Err(lost) => Ok(Err(lost.into())),
    }
}
