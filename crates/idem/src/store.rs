//! For store implementers: the store contract (see [`crate::contract`]),
//! five required atomic primitives in [`Store`] and small capability traits
//! for what not every caller needs, with the types they take and answer
//! ([`ClaimParams`], [`ClaimOutcome`], [`Lease`], [`StepBegin`],
//! [`Completion`]) and the helpers stores share ([`poll_while`],
//! [`journal_of`], [`held`], [`crate::group`]). The traits a user calls on
//! a store (`get`, `list`, `delete`, `purge_expired`) are also at the
//! crate's root; the rest are only here.
//!
//! Every primitive must be atomic on its own. There are no default
//! implementations of correctness-critical methods: a store either performs
//! the transition atomically or does not implement the trait.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::clock::Timestamp;
pub use crate::clock::{held, LONGEST_HELD};
use crate::key::{RecordId, Scope};
pub use crate::record::{ClaimOutcome, ClaimParams, Lease, LeaseToken, StepBegin, TokenMint};
use crate::record::{Failure, Record, Resolution, Resolved, StateKind, StepEntry};

/// A boxed error from a store's backend.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store operation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The record no longer carries the lease's token (taken over, released,
    /// deleted or expired). Nothing was written.
    #[error("lease lost: the record no longer carries this lease's token")]
    LeaseLost,
    /// The store could not be reached or did not answer in time. Whether a
    /// write happened is unknown; the executor fails closed.
    #[error("store unavailable")]
    Unavailable(#[source] BoxError),
    /// The store is at its configured size and holds no expired record to
    /// make room with. Live records are never evicted.
    #[error("store is full: {capacity} live records (no expired record to evict)")]
    CapacityExceeded {
        /// The configured limit.
        capacity: usize,
    },
    /// A stored record could not be decoded.
    #[error("stored record {id} is corrupt: {reason}")]
    Corrupt {
        /// The record's id, as `scope/key`.
        id: String,
        /// What was wrong.
        reason: String,
    },
    /// The backend reported an error that is not one of the above.
    #[error("store backend error")]
    Backend(#[source] BoxError),
}

/// The source of a [`StoreError::Unavailable`] raised when a write met
/// another on the same record: a lock waited on too long, a deadlock, a
/// conflict with a concurrent transaction. The store is up and the key is
/// busy, most likely with a duplicate of this very request: retried like
/// any transient error, but never a reason to fail open, which would run
/// the duplicate beside it ([`StoreError::is_contention`]).
#[derive(Debug, thiserror::Error)]
#[error("contended: {0}")]
pub struct Contended(pub BoxError);

impl StoreError {
    /// A transient error that met a concurrent write on the record
    /// ([`Contended`]).
    pub fn contended(source: impl Into<BoxError>) -> Self {
        StoreError::Unavailable(Box::new(Contended(source.into())))
    }

    /// Whether this is a [`Contended`] error: the key is busy, the store
    /// is not down.
    pub fn is_contention(&self) -> bool {
        matches!(self, StoreError::Unavailable(source) if source.is::<Contended>())
    }

    /// Whether the store answered and said no (too large, invalid,
    /// corrupt, full): a definite refusal, that sending the same write
    /// again will not change. Not a lost lease (the record moved on), and
    /// never [`StoreError::Unavailable`], whose write may yet land: a
    /// transient error is retried within the lease and read back
    /// (docs/design.md §5.5).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, StoreError::LeaseLost | StoreError::Unavailable(_))
    }

    /// The same error again, for each entry of a batch that failed as a
    /// whole: the same variant, the same text (sources as one line).
    pub fn copy(&self) -> StoreError {
        match self {
            StoreError::LeaseLost => StoreError::LeaseLost,
            StoreError::Unavailable(e) if e.is::<Contended>() => {
                StoreError::contended(crate::error_chain(&**e))
            }
            StoreError::Unavailable(e) => StoreError::Unavailable(crate::error_chain(&**e).into()),
            StoreError::CapacityExceeded { capacity } => StoreError::CapacityExceeded {
                capacity: *capacity,
            },
            StoreError::Corrupt { id, reason } => StoreError::Corrupt {
                id: id.clone(),
                reason: reason.clone(),
            },
            StoreError::Backend(e) => StoreError::Backend(crate::error_chain(&**e).into()),
        }
    }
}

impl From<crate::machine::LeaseLost> for StoreError {
    fn from(_: crate::machine::LeaseLost) -> Self {
        StoreError::LeaseLost
    }
}

/// The required atomic primitives. See [the contract](crate::contract);
/// `idem-testkit` checks it.
pub trait Store: Send + Sync + 'static {
    /// Claims `id`: acquires it if absent, expired or released, takes it
    /// over if its lease has run out, and otherwise reports what is there.
    fn claim(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Stores `response` as the outcome, kept for `retention`, if the record
    /// still carries `lease`'s token; otherwise [`StoreError::LeaseLost`].
    fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records a failure under the same token check. Retryable failures
    /// release the record; terminal and unknown ones are kept for
    /// `retention` and replayed.
    fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Heartbeat: extends the lease to `now + lease` (never shortening it)
    /// under the same token check, and returns the new deadline.
    fn extend(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<Timestamp, StoreError>> + Send;

    /// Gives the claim back under the same token check; the next claim
    /// acquires it with the attempt count carried on.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Waits until `id` may have changed, or `timeout` passes. This is a
    /// hint used to wait for an in-flight duplicate's outcome: stores that
    /// can notify override it; the default sleeps for `timeout`, and the
    /// caller re-claims afterwards either way.
    fn wait_for_change(&self, id: &RecordId, timeout: Duration) -> impl Future<Output = ()> + Send {
        let _ = id;
        tokio::time::sleep(timeout)
    }

    /// The record of `id` as it is now, or `None` if absent or expired,
    /// read without claiming or changing anything. The executor uses it to
    /// learn whether a write whose answer was lost had landed, and the
    /// completer to check that a record it listed is still abandoned:
    /// a claim there could create a record for a key that is gone, bound
    /// to a request's fingerprint. Stores that implement [`GetRecord`]
    /// answer with [`GetRecord::get`], wired by
    /// [`store_capabilities!(peek)`](crate::store_capabilities); the
    /// default says the store cannot (callers then treat the record as
    /// unknown).
    fn peek(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        let _ = id;
        std::future::ready(Err(StoreError::Backend(
            "this store cannot read a record without claiming it".into(),
        )))
    }

    /// This store's step journal, for [`Context::step`](crate::Context::step):
    /// stores that implement [`StepJournal`] return
    /// `Some(journal_of(self.clone()))`, wired by
    /// [`store_capabilities!(steps)`](crate::store_capabilities). The
    /// default, `None`, makes every
    /// step fail with [`StepError::Unsupported`](crate::step::StepError::Unsupported).
    fn step_journal(&self) -> Option<Arc<dyn DynStepJournal>> {
        None
    }

    /// The store's own clock, for stores that decide time on a local
    /// [`Clock`](crate::Clock) rather than on a server's: the executor's
    /// replay cache ends an entry when this clock passes the record's
    /// expiry, so moving it (a manual clock in tests) ends both alike. The
    /// default, `None`, is a networked store deciding on its server's clock.
    fn local_now(&self) -> Option<Timestamp> {
        None
    }
}

/// A [`Store::wait_for_change`] for stores that cannot notify: calls
/// `still_waiting` with a backoff from 5 ms up to 200 ms until it answers
/// `false` or `timeout` passes. The check should be one cheap read (the
/// record's state).
pub async fn poll_while<F, Fut>(timeout: Duration, mut still_waiting: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_millis(200);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = FIRST;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(delay.min(left)).await;
        if !still_waiting().await {
            return;
        }
        delay = (delay * 2).min(MAX);
    }
}

/// Reads a record (expired records read as absent).
pub trait GetRecord: Store {
    /// The record for `id`, or `None` if absent or expired.
    fn get(&self, id: &RecordId)
        -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
}

/// Deletes a record whatever its state: the admin's force-release. Any
/// lease on it is lost; fencing numbers stay monotonic.
pub trait DeleteRecord: Store {
    /// Deletes `id`; `true` if a live record was there.
    fn delete(&self, id: &RecordId) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// A page request for [`ListRecords`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only records in this state, if set.
    pub state: Option<StateKind>,
    /// Only records in this scope, if set.
    pub scope: Option<Scope>,
    /// Start after this id (the previous page's `next`).
    pub after: Option<RecordId>,
    /// At most this many records.
    pub limit: usize,
}

impl ListQuery {
    /// The first page of up to `limit` records of any state and scope.
    pub fn new(limit: usize) -> Self {
        Self {
            state: None,
            scope: None,
            after: None,
            limit,
        }
    }

    /// Only records in `state`.
    pub fn state(mut self, state: StateKind) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records in `scope`.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Start after `id`.
    pub fn after(mut self, id: RecordId) -> Self {
        self.after = Some(id);
        self
    }
}

/// One page of live records, ordered by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The records on this page.
    pub records: Vec<(RecordId, Record)>,
    /// Where the next page starts, if there may be one.
    pub next: Option<RecordId>,
}

impl ListPage {
    /// A page of `records` a store read in id order, at most `limit` of
    /// them: `next` is set when the page is full (there may be more).
    pub fn ordered(records: Vec<(RecordId, Record)>, limit: usize) -> Self {
        let next = (records.len() == limit && limit > 0)
            .then(|| records.last().map(|(id, _)| id.clone()))
            .flatten();
        Self { records, next }
    }

    /// The first `limit` of `found` in id order, for stores that find a
    /// page's records in no particular order (a scan): `next` is set when
    /// more were found than fit.
    pub fn first_of(mut found: Vec<(RecordId, Record)>, limit: usize) -> Self {
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let more = found.len() > limit;
        found.truncate(limit);
        let next = if more {
            found.last().map(|(id, _)| id.clone())
        } else {
            None
        };
        Self {
            records: found,
            next,
        }
    }
}

/// Lists live records by state and scope, in id order, a page at a time.
pub trait ListRecords: Store {
    /// One page of records matching `query`.
    fn list(&self, query: &ListQuery) -> impl Future<Output = Result<ListPage, StoreError>> + Send;
}

/// Removes expired records in bounded batches.
pub trait PurgeExpired: Store {
    /// Removes at most `limit` expired records; returns how many. Call
    /// again while it returns `limit`.
    fn purge_expired(&self, limit: usize)
        -> impl Future<Output = Result<usize, StoreError>> + Send;
}

/// Finds abandoned records: in progress, live, with a lease that has run
/// out (their holder crashed, was killed or stalled), as the store's own
/// clock sees it. The [`Completer`](crate::durable::Completer) re-drives
/// them.
pub trait FindAbandoned: Store {
    /// Up to `limit` abandoned records of `scope` (see
    /// [`Record::is_abandoned`](crate::Record::is_abandoned)). Stores with
    /// an index return the longest-abandoned first; every store returns
    /// each abandoned record on some call as long as it stays abandoned.
    fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(RecordId, Record)>, StoreError>> + Send;
}

/// How long a completed record stays live, measured by the store's own
/// clock: what a cache in front of the store
/// ([`Cached`](crate::cache::Cached)) needs so that it never serves a
/// record past its expiry.
pub trait RecordTtl: Store {
    /// The time left before `id` expires, if it is completed with exactly
    /// `response`; `None` if it is absent, expired, or holds anything else.
    /// Read in one step with the record, so that a record deleted and
    /// claimed again since `response` was read (a new run, in progress) is
    /// never cached under the new record's life.
    fn ttl(
        &self,
        id: &RecordId,
        response: &[u8],
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send;
}

/// Claims many records in one round trip. Each claim is atomic on its own;
/// the batch as a whole is not a transaction.
pub trait ClaimMany: Store {
    /// One result per claim, in order.
    fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> impl Future<Output = Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError>> + Send;
}

/// One completion for [`CompleteMany`]: what [`Store::complete`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The holder's lease; the record must still carry its token.
    pub lease: Lease,
    /// The outcome to store.
    pub response: Bytes,
    /// How long the outcome is kept.
    pub retention: Duration,
}

impl Completion {
    /// The completion of `lease` with `response`, kept for `retention`.
    pub fn new(lease: Lease, response: Bytes, retention: Duration) -> Self {
        Self {
            lease,
            response,
            retention,
        }
    }
}

/// Completes many records in one round trip. Each completion is atomic on
/// its own and checked against its own lease's token, exactly as
/// [`Store::complete`] would check it; the batch as a whole is not a
/// transaction, so one lease lost fails that entry alone.
pub trait CompleteMany: Store {
    /// One result per completion, in order: `Ok(())` if stored,
    /// [`StoreError::LeaseLost`] (nothing written) or another error for
    /// that entry alone. The outer error means no answer came for the
    /// batch, so whether any completion landed is unknown.
    fn complete_many(
        &self,
        completions: &[Completion],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;
}

/// The step journal (see [the contract](crate::contract) and
/// [`Context::step`](crate::Context::step)): per record, each named step's
/// state, written under the lease's token check and kept exactly as long
/// as the record. A claim that starts a new record (absent, expired or
/// deleted before) starts with an empty journal; a takeover or a claim
/// after a release keeps it, which is what lets a later attempt resume.
pub trait StepJournal: Store {
    /// If the record still carries `lease`'s token: a finished step's
    /// result ([`StepBegin::Done`], nothing written), or marks the step
    /// started by `lease.attempt` and says whether an earlier attempt had
    /// left it started ([`StepBegin::InDoubt`]) or not ([`StepBegin::Fresh`]).
    /// Otherwise [`StoreError::LeaseLost`].
    fn begin_step(
        &self,
        lease: &Lease,
        step: &str,
    ) -> impl Future<Output = Result<StepBegin, StoreError>> + Send;

    /// Journals `result` as the step's result under the same token check.
    fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The journal of `id`, in step-name order (empty if the record is
    /// absent or expired).
    fn steps(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Vec<StepEntry>, StoreError>> + Send;

    /// An operator's resolution of a parked record (failed with an unknown
    /// outcome) whose step `step` is in doubt: journals the finding and
    /// releases the record, atomically, so the next claim resumes it.
    fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send;
}

/// A boxed future, for [`DynStepJournal`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The dyn-compatible form of a [`StepJournal`]'s holder writes, as the
/// executor keeps it (see [`Store::step_journal`]). Implemented for every
/// [`StepJournal`]; wrap one with [`journal_of`].
pub trait DynStepJournal: Send + Sync + 'static {
    /// [`StepJournal::begin_step`].
    fn begin_step<'a>(
        &'a self,
        lease: &'a Lease,
        step: &'a str,
    ) -> BoxFuture<'a, Result<StepBegin, StoreError>>;

    /// [`StepJournal::finish_step`].
    fn finish_step<'a>(
        &'a self,
        lease: &'a Lease,
        step: &'a str,
        result: Bytes,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

impl<S: StepJournal> DynStepJournal for S {
    fn begin_step<'a>(
        &'a self,
        lease: &'a Lease,
        step: &'a str,
    ) -> BoxFuture<'a, Result<StepBegin, StoreError>> {
        Box::pin(StepJournal::begin_step(self, lease, step))
    }

    fn finish_step<'a>(
        &'a self,
        lease: &'a Lease,
        step: &'a str,
        result: Bytes,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(StepJournal::finish_step(self, lease, step, result))
    }
}

/// `store` as the executor keeps a step journal: what a
/// [`StepJournal`]'s [`Store::step_journal`] returns.
pub fn journal_of<S: StepJournal>(store: S) -> Arc<dyn DynStepJournal> {
    Arc::new(store)
}

impl<S: Store> Store for Arc<S> {
    fn claim(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send {
        (**self).claim(id, params)
    }
    fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).complete(lease, response, retention)
    }
    fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).fail(lease, failure, retention)
    }
    fn extend(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<Timestamp, StoreError>> + Send {
        (**self).extend(lease, duration)
    }
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(lease)
    }
    fn wait_for_change(&self, id: &RecordId, timeout: Duration) -> impl Future<Output = ()> + Send {
        (**self).wait_for_change(id, timeout)
    }
    fn peek(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        (**self).peek(id)
    }
    fn step_journal(&self) -> Option<Arc<dyn DynStepJournal>> {
        (**self).step_journal()
    }
    fn local_now(&self) -> Option<Timestamp> {
        (**self).local_now()
    }
}

impl<S: StepJournal> StepJournal for Arc<S> {
    fn begin_step(
        &self,
        lease: &Lease,
        step: &str,
    ) -> impl Future<Output = Result<StepBegin, StoreError>> + Send {
        (**self).begin_step(lease, step)
    }
    fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).finish_step(lease, step, result)
    }
    fn steps(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Vec<StepEntry>, StoreError>> + Send {
        (**self).steps(id)
    }
    fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        (**self).resolve_step(id, step, resolution)
    }
}

impl<S: CompleteMany> CompleteMany for Arc<S> {
    fn complete_many(
        &self,
        completions: &[Completion],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send {
        (**self).complete_many(completions)
    }
}

impl<S: ClaimMany> ClaimMany for Arc<S> {
    fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> impl Future<Output = Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError>> + Send
    {
        (**self).claim_many(claims)
    }
}

impl<S: FindAbandoned> FindAbandoned for Arc<S> {
    fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(RecordId, Record)>, StoreError>> + Send {
        (**self).abandoned(scope, limit)
    }
}
