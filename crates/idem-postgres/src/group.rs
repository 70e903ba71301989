//! Group commit ([`idem::group`]): claims that callers make at the same
//! time go to PostgreSQL as one `claim_many` statement, completions as one
//! `complete_many` statement, instead of a statement (and a WAL flush)
//! each. A lone call runs its own statement at once.
//!
//! Each claim and completion is still atomic and answered on its own, as
//! [`ClaimMany`] and [`CompleteMany`] promise; a statement that fails as a
//! whole fails each call in it with the same error.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::group::{Batch, GroupCommit, Limits};
use idem::{
    ClaimMany, ClaimOutcome, ClaimParams, CompleteMany, Completion, Lease, RecordId, StoreError,
};

/// What a group sends through: a copy of the store without groups, whose
/// calls go straight to the server, one statement each or one for many.
pub(crate) trait Direct: ClaimMany + CompleteMany + Clone + 'static {
    /// One claim statement.
    fn claim_one(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// One complete statement.
    fn complete_one(
        &self,
        lease: &Lease,
        response: &[u8],
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The group commits of one store. Each holds a copy of the store without
/// them, whose calls go straight to the server.
pub(crate) struct Groups<S: Direct> {
    claims: Arc<GroupCommit<Claims<S>>>,
    completions: Arc<GroupCommit<Completions<S>>>,
}

impl<S: Direct> std::fmt::Debug for Groups<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Groups").finish_non_exhaustive()
    }
}

impl<S: Direct> Groups<S> {
    /// The group commits of `store`, which must not have its own.
    pub(crate) fn new(store: &S) -> Self {
        Self {
            claims: GroupCommit::new(Claims(store.clone()), Limits::default()),
            completions: GroupCommit::new(Completions(store.clone()), Limits::default()),
        }
    }

    pub(crate) async fn claim(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claims.call((id.clone(), params.clone())).await
    }

    pub(crate) async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let completion = Completion::new(lease.clone(), response, retention);
        self.completions.call(completion).await
    }
}

/// Claims, together as one `claim_many` statement.
pub(crate) struct Claims<S>(S);

impl<S: Direct> Batch for Claims<S> {
    type Call = (RecordId, ClaimParams);
    type Reply = Result<ClaimOutcome, StoreError>;

    async fn one(&self, (id, params): (RecordId, ClaimParams)) -> Self::Reply {
        self.0.claim_one(&id, &params).await
    }

    async fn many(&self, calls: Vec<(RecordId, ClaimParams)>) -> Vec<Self::Reply> {
        match self.0.claim_many(&calls).await {
            Ok(replies) => replies,
            Err(error) => calls.iter().map(|_| Err(error.copy())).collect(),
        }
    }

    fn lost(&self) -> Self::Reply {
        Err(idem::group::lost())
    }
}

/// Completions, together as one `complete_many` statement.
pub(crate) struct Completions<S>(S);

impl<S: Direct> Batch for Completions<S> {
    type Call = Completion;
    type Reply = Result<(), StoreError>;

    async fn one(&self, c: Completion) -> Self::Reply {
        self.0
            .complete_one(&c.lease, &c.response, c.retention)
            .await
    }

    async fn many(&self, calls: Vec<Completion>) -> Vec<Self::Reply> {
        match self.0.complete_many(&calls).await {
            Ok(replies) => replies,
            Err(error) => calls.iter().map(|_| Err(error.copy())).collect(),
        }
    }

    fn lost(&self) -> Self::Reply {
        Err(idem::group::lost())
    }

    fn bytes(&self, c: &Completion) -> usize {
        c.response.len()
    }
}
