//! Group commit ([`idem::group`]): claims that callers make at the same
//! time go to PostgreSQL as one `claim_many` statement, completions as one
//! `complete_many` statement, instead of a statement (and a WAL flush)
//! each. A lone call runs its own statement at once.
//!
//! Each claim and completion is still atomic and answered on its own, as
//! [`ClaimMany`] and [`CompleteMany`] promise; a statement that fails as a
//! whole fails each call in it with the same error.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::group::{Batch, GroupCommit, Limits};
use idem::{
    ClaimMany, ClaimOutcome, ClaimParams, CompleteMany, Completion, Lease, RecordId, StoreError,
};

use crate::PgStore;

/// The group commits of one store. Each holds a copy of the store without
/// them, whose calls go straight to the server.
#[derive(Debug)]
pub(crate) struct Groups {
    claims: Arc<GroupCommit<Claims>>,
    completions: Arc<GroupCommit<Completions>>,
}

impl Groups {
    /// The group commits of `store`, which must not have its own.
    pub(crate) fn new(store: &PgStore) -> Self {
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
pub(crate) struct Claims(PgStore);

impl Batch for Claims {
    type Call = (RecordId, ClaimParams);
    type Reply = Result<ClaimOutcome, StoreError>;

    async fn one(&self, (id, params): (RecordId, ClaimParams)) -> Self::Reply {
        self.0.claim_single(&id, &params).await
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
pub(crate) struct Completions(PgStore);

impl Batch for Completions {
    type Call = Completion;
    type Reply = Result<(), StoreError>;

    async fn one(&self, c: Completion) -> Self::Reply {
        self.0
            .complete_single(&c.lease, &c.response, c.retention)
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
