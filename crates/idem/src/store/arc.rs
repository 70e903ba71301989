//! A store shared behind an [`Arc`] is the same store, with every
//! capability it has.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{
    ClaimMany, CompleteMany, Completion, DynPendingSends, DynStepJournal, FindAbandoned, ListPage,
    ListQuery, ListRecords, StepJournal, Store, StoreError,
};
use crate::clock::Timestamp;
use crate::key::{RecordId, Scope};
use crate::record::{
    ClaimOutcome, ClaimParams, Failure, Lease, Record, Resolution, Resolved, StepBegin, StepEntry,
};

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
    fn pending_sends(&self) -> Option<Arc<dyn DynPendingSends>> {
        (**self).pending_sends()
    }
    fn local_now(&self) -> Option<Timestamp> {
        (**self).local_now()
    }
    fn keeps_bytes(&self) -> bool {
        (**self).keeps_bytes()
    }
    fn sends_messages(&self) -> bool {
        (**self).sends_messages()
    }
    fn max_stored_bytes(&self) -> Option<usize> {
        (**self).max_stored_bytes()
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

impl<S: ListRecords> ListRecords for Arc<S> {
    fn list(&self, query: &ListQuery) -> impl Future<Output = Result<ListPage, StoreError>> + Send {
        (**self).list(query)
    }
}
