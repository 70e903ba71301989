//! Runs whose messages are not yet confirmed sent, kept by the store
//! itself: the outbox's pending index.
//!
//! Without it, a run that sends holds a *marker* — a record of its own,
//! claimed before the completion and completed once the messages are
//! confirmed — so the outbox works on every store with the five
//! primitives alone, at the price of two more writes per sending run. A
//! store that implements [`PendingSends`] marks the run pending in the
//! completion's own write instead, and clears the mark once its messages
//! are confirmed: one write more, not two, and none before the
//! completion.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{BoxFuture, Store, StoreError};
use crate::key::{RecordId, Scope};
use crate::record::Lease;

/// A run marked pending, taken by a dispatcher (or a replay) that now
/// holds its mark for a while: the run, the fence it was completed under,
/// and its stored response (with its messages inside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRun {
    /// The run.
    pub id: RecordId,
    /// The fence of the claim that completed it, which
    /// [`confirm_sent`](PendingSends::confirm_sent) names.
    pub fence: u64,
    /// The response the run was completed with, as stored.
    pub response: Bytes,
}

/// The outbox's pending index, wired by
/// [`store_capabilities!(pending)`](crate::store_capabilities): a store
/// that keeps one marks a run pending in its completion's own write and
/// clears the mark once the run's messages are confirmed, where a store
/// without one makes the run hold a marker record (see [`crate::outbox`]).
/// Every time is the store's clock, as for leases.
///
/// A mark lives no longer than its run's record: a record that expires,
/// is deleted or is claimed again takes its mark with it (or leaves one
/// that [`take_pending`](Self::take_pending) drops instead of answering).
pub trait PendingSends: Store {
    /// [`Store::complete`], and in the same atomic write marks the run
    /// pending — its response holds messages not yet confirmed sent — held
    /// by the completer for `hold`: until then neither a dispatcher nor a
    /// replay takes it. Nothing is written when the lease is lost.
    fn complete_pending(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
        hold: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Clears the mark of the run `id` completed under `fence`: its
    /// messages were all confirmed sent. A mark already cleared, or one of
    /// a later run of the key (another fence), is left as it is, and that
    /// is not an error.
    fn confirm_sent(
        &self,
        id: &RecordId,
        fence: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Up to `limit` runs of `scope` marked pending whose hold ran out,
    /// each held now by the caller for `hold`: what a dispatcher sends.
    /// Two callers at once never take the same run.
    fn take_pending(
        &self,
        scope: &Scope,
        hold: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingRun>, StoreError>> + Send;

    /// The run `id`, if it is marked pending and its hold ran out, held
    /// now by the caller for `hold`: what a replay re-dispatches.
    fn take_pending_run(
        &self,
        id: &RecordId,
        hold: Duration,
    ) -> impl Future<Output = Result<Option<PendingRun>, StoreError>> + Send;
}

/// The dyn-compatible form of a [`PendingSends`], as the executor keeps it
/// (see [`Store::pending_sends`]). Implemented for every [`PendingSends`];
/// wrap one with [`pending_of`].
pub trait DynPendingSends: Send + Sync + 'static {
    /// [`PendingSends::complete_pending`].
    fn complete_pending<'a>(
        &'a self,
        lease: &'a Lease,
        response: Bytes,
        retention: Duration,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// [`PendingSends::confirm_sent`].
    fn confirm_sent<'a>(
        &'a self,
        id: &'a RecordId,
        fence: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// [`PendingSends::take_pending`].
    fn take_pending<'a>(
        &'a self,
        scope: &'a Scope,
        hold: Duration,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<PendingRun>, StoreError>>;

    /// [`PendingSends::take_pending_run`].
    fn take_pending_run<'a>(
        &'a self,
        id: &'a RecordId,
        hold: Duration,
    ) -> BoxFuture<'a, Result<Option<PendingRun>, StoreError>>;
}

impl<S: PendingSends> DynPendingSends for S {
    fn complete_pending<'a>(
        &'a self,
        lease: &'a Lease,
        response: Bytes,
        retention: Duration,
        hold: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(PendingSends::complete_pending(
            self, lease, response, retention, hold,
        ))
    }

    fn confirm_sent<'a>(
        &'a self,
        id: &'a RecordId,
        fence: u64,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(PendingSends::confirm_sent(self, id, fence))
    }

    fn take_pending<'a>(
        &'a self,
        scope: &'a Scope,
        hold: Duration,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<PendingRun>, StoreError>> {
        Box::pin(PendingSends::take_pending(self, scope, hold, limit))
    }

    fn take_pending_run<'a>(
        &'a self,
        id: &'a RecordId,
        hold: Duration,
    ) -> BoxFuture<'a, Result<Option<PendingRun>, StoreError>> {
        Box::pin(PendingSends::take_pending_run(self, id, hold))
    }
}

/// `store` as the executor keeps a pending index: what a
/// [`PendingSends`]'s [`Store::pending_sends`] returns.
pub fn pending_of<S: PendingSends>(store: S) -> Arc<dyn DynPendingSends> {
    Arc::new(store)
}
