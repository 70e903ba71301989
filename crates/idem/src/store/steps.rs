//! The step journal: each named step's state, per record.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use super::{Store, StoreError};
use crate::key::RecordId;
use crate::record::{Lease, Resolution, Resolved, StepBegin, StepEntry};

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

/// The dyn-compatible form of a [`StepJournal`], as the executor keeps it
/// (see [`Store::step_journal`]). Implemented for every [`StepJournal`];
/// wrap one with [`journal_of`].
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

    /// [`StepJournal::steps`].
    fn steps<'a>(&'a self, id: &'a RecordId) -> BoxFuture<'a, Result<Vec<StepEntry>, StoreError>>;

    /// [`StepJournal::resolve_step`].
    fn resolve_step<'a>(
        &'a self,
        id: &'a RecordId,
        step: &'a str,
        resolution: Resolution,
    ) -> BoxFuture<'a, Result<Resolved, StoreError>>;
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

    fn steps<'a>(&'a self, id: &'a RecordId) -> BoxFuture<'a, Result<Vec<StepEntry>, StoreError>> {
        Box::pin(StepJournal::steps(self, id))
    }

    fn resolve_step<'a>(
        &'a self,
        id: &'a RecordId,
        step: &'a str,
        resolution: Resolution,
    ) -> BoxFuture<'a, Result<Resolved, StoreError>> {
        Box::pin(StepJournal::resolve_step(self, id, step, resolution))
    }
}

/// `store` as the executor keeps a step journal: what a
/// [`StepJournal`]'s [`Store::step_journal`] returns.
pub fn journal_of<S: StepJournal>(store: S) -> Arc<dyn DynStepJournal> {
    Arc::new(store)
}
