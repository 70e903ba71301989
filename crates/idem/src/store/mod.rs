//! For store implementers: the store contract (see [`crate::contract`]),
//! five required atomic primitives in [`Store`] and small capability traits
//! for what not every caller needs, with the types they take and answer
//! ([`ClaimParams`], [`ClaimOutcome`], [`Lease`], [`StepBegin`],
//! [`Completion`]) and the helpers stores share ([`poll_while`],
//! [`journal_of`], [`pending_of`], [`held`], [`crate::group`]). The traits a user calls on
//! a store (`get`, `list`, `delete`, `purge_expired`) are also at the
//! crate's root; the rest are only here.
//!
//! Every primitive must be atomic on its own. There are no default
//! implementations of correctness-critical methods: a store either performs
//! the transition atomically or does not implement the trait.
//!
//! The files follow a store crate's own floor plan: the required
//! primitives and errors here, the admin capabilities in `admin.rs`, group
//! commit in `many.rs`, the step journal in `steps.rs`, the outbox's
//! pending index in `pending.rs`.

mod admin;
mod arc;
mod many;
mod pending;
mod steps;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use admin::{
    DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, PurgeExpired,
    RecordTtl,
};
pub use many::{ClaimMany, CompleteMany, Completion};
pub use pending::{pending_of, DynPendingSends, PendingRun, PendingSends};
pub use steps::{journal_of, BoxFuture, DynStepJournal, StepJournal};

use crate::clock::Timestamp;
pub use crate::clock::{held, LONGEST_HELD};
use crate::key::RecordId;
pub use crate::record::{ClaimOutcome, ClaimParams, Lease, LeaseToken, StepBegin, TokenMint};
use crate::record::{Failure, Record};

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

    /// This store's pending index for the outbox: stores that implement
    /// [`PendingSends`] return `Some(pending_of(self.clone()))`, wired by
    /// [`store_capabilities!(pending)`](crate::store_capabilities). The
    /// default, `None`, makes a run that sends hold a marker record
    /// instead ([`crate::outbox`]).
    fn pending_sends(&self) -> Option<Arc<dyn DynPendingSends>> {
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

    /// Whether the store keeps the response bytes the executor hands it
    /// as they are. A store that re-encodes them (the remote store sends
    /// the JSON inside) answers `false`, and an executor refuses to seal
    /// payloads ([`keyring`](crate::IdempotencyBuilder::keyring)) for it:
    /// seal on the side that stores instead.
    fn keeps_bytes(&self) -> bool {
        true
    }

    /// Whether the store takes the messages a run sends with its
    /// completion (inside the bytes handed to
    /// [`complete`](Self::complete)) and sees them sent on its side. The
    /// remote store does: `idem serve` stores them with the result and
    /// dispatches them. An executor built with
    /// [`outbox_sent_by_store`](crate::IdempotencyBuilder::outbox_sent_by_store)
    /// needs such a store.
    fn sends_messages(&self) -> bool {
        false
    }

    /// The largest response, as stored (the bytes handed to
    /// [`complete`](Self::complete): compressed and sealed), this store
    /// keeps; `None` when it has no limit of its own that matters (beyond
    /// a gigabyte, say). The executor checks each response against it
    /// before sending it, so one too large is recorded as a failure with
    /// a clear reason, never sent to a server that would drop the
    /// connection (an unknown outcome, and a live claim).
    fn max_stored_bytes(&self) -> Option<usize> {
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
