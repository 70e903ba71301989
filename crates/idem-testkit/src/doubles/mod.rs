//! Store doubles for tests of the logic above a store (the executor, the
//! HTTP layer, consumers): a real store underneath, and [`Hooks`] that
//! answer the calls a test wants to change. Every call a hook does not
//! override goes to the real store, so a double is a few lines about what
//! it changes, not a page of forwarding. Stores themselves are proven
//! against real servers, never through a double.

mod clock;
mod down;
pub mod proxy;

pub use clock::TokioClock;
pub use down::DownStore;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Completion, DynStepJournal, Lease};
use idem::{ClaimMany, CompleteMany, Failure, Record, RecordId, Store, StoreError, Timestamp};

/// What a [`Double`] changes. Each method gets the real store and, unless
/// overridden, answers as it does.
pub trait Hooks<S: Store>: Send + Sync + 'static {
    /// [`Store::claim`].
    fn claim(
        &self,
        inner: &S,
        id: &RecordId,
        params: &ClaimParams,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send {
        inner.claim(id, params)
    }

    /// [`Store::complete`].
    fn complete(
        &self,
        inner: &S,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        inner.complete(lease, response, retention)
    }

    /// [`Store::fail`].
    fn fail(
        &self,
        inner: &S,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        inner.fail(lease, failure, retention)
    }

    /// [`Store::extend`].
    fn extend(
        &self,
        inner: &S,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<Timestamp, StoreError>> + Send {
        inner.extend(lease, duration)
    }

    /// [`Store::release`].
    fn release(
        &self,
        inner: &S,
        lease: &Lease,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        inner.release(lease)
    }

    /// [`Store::peek`].
    fn peek(
        &self,
        inner: &S,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        inner.peek(id)
    }

    /// [`Store::step_journal`].
    fn step_journal(&self, inner: &S) -> Option<Arc<dyn DynStepJournal>> {
        inner.step_journal()
    }

    /// [`Store::keeps_bytes`].
    fn keeps_bytes(&self, inner: &S) -> bool {
        inner.keeps_bytes()
    }
}

/// What a [`Double`] changes in batches, for a real store with
/// [`ClaimMany`] and [`CompleteMany`]; unless overridden, answers as it
/// does.
pub trait ManyHooks<S: ClaimMany + CompleteMany>: Hooks<S> {
    /// [`ClaimMany::claim_many`].
    fn claim_many(
        &self,
        inner: &S,
        claims: &[(RecordId, ClaimParams)],
    ) -> impl Future<Output = Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError>> + Send
    {
        inner.claim_many(claims)
    }

    /// [`CompleteMany::complete_many`].
    fn complete_many(
        &self,
        inner: &S,
        completions: &[Completion],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send {
        inner.complete_many(completions)
    }
}

/// The real store `inner`, with `hooks` in front of it.
#[derive(Debug, Clone, Default)]
pub struct Double<S, H> {
    /// The real store, for the test to read what was written.
    pub inner: S,
    /// What the double changes, with any state of its own.
    pub hooks: H,
}

impl<S: Store, H: Hooks<S>> Double<S, H> {
    /// `inner` with `hooks` in front.
    pub fn new(inner: S, hooks: H) -> Self {
        Self { inner, hooks }
    }
}

impl<S: Store, H: Hooks<S>> Store for Double<S, H> {
    fn claim(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send {
        self.hooks.claim(&self.inner, id, params)
    }

    fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.hooks.complete(&self.inner, lease, response, retention)
    }

    fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.hooks.fail(&self.inner, lease, failure, retention)
    }

    fn extend(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<Timestamp, StoreError>> + Send {
        self.hooks.extend(&self.inner, lease, duration)
    }

    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.hooks.release(&self.inner, lease)
    }

    fn wait_for_change(&self, id: &RecordId, timeout: Duration) -> impl Future<Output = ()> + Send {
        self.inner.wait_for_change(id, timeout)
    }

    fn peek(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        self.hooks.peek(&self.inner, id)
    }

    fn step_journal(&self) -> Option<Arc<dyn DynStepJournal>> {
        self.hooks.step_journal(&self.inner)
    }

    fn local_now(&self) -> Option<idem::Timestamp> {
        self.inner.local_now()
    }

    fn keeps_bytes(&self) -> bool {
        self.hooks.keeps_bytes(&self.inner)
    }

    fn sends_messages(&self) -> bool {
        self.inner.sends_messages()
    }

    fn max_stored_bytes(&self) -> Option<usize> {
        self.inner.max_stored_bytes()
    }
}

impl<S: ClaimMany + CompleteMany, H: ManyHooks<S>> ClaimMany for Double<S, H> {
    fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> impl Future<Output = Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError>> + Send
    {
        self.hooks.claim_many(&self.inner, claims)
    }
}

impl<S: ClaimMany + CompleteMany, H: ManyHooks<S>> CompleteMany for Double<S, H> {
    fn complete_many(
        &self,
        completions: &[Completion],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send {
        self.hooks.complete_many(&self.inner, completions)
    }
}

/// A store that keeps no step journal: every step is refused before it
/// runs ([`StepError::Unsupported`](idem::step::StepError::Unsupported)).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJournal;

impl<S: Store> Hooks<S> for NoJournal {
    fn step_journal(&self, _: &S) -> Option<Arc<dyn DynStepJournal>> {
        None
    }
}
