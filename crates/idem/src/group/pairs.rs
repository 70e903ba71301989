//! [`Pairs`]: the group commits of a store whose claims and completions
//! have a batch form ([`ClaimMany`], [`CompleteMany`]) beside a single
//! one ([`Direct`]), as the relational stores have: claims made at the
//! same time go as one `claim_many`, completions as one `complete_many`,
//! each still answered on its own; a lone call runs its single form at
//! once. A batch that fails as a whole fails each call in it with the
//! same error.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{lost, Batch, GroupCommit, Limits};
use crate::{
    ClaimMany, ClaimOutcome, ClaimParams, CompleteMany, Completion, Lease, RecordId, StoreError,
};

/// What a group sends through: a copy of the store without groups, whose
/// calls go straight to the server, one statement each or one for many.
pub trait Direct: ClaimMany + CompleteMany + Clone + Send + Sync + 'static {
    /// One claim, on its own.
    fn claim_one(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// One completion, on its own.
    fn complete_one(
        &self,
        lease: &Lease,
        response: &[u8],
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The group commits of one store. Each holds a copy of the store without
/// them, whose calls go straight to the server.
pub struct Pairs<S: Direct> {
    claims: Arc<GroupCommit<Claims<S>>>,
    completions: Arc<GroupCommit<Completions<S>>>,
}

impl<S: Direct> std::fmt::Debug for Pairs<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pairs").finish_non_exhaustive()
    }
}

impl<S: Direct> Pairs<S> {
    /// The group commits of `store`, which must not have its own.
    pub fn new(store: &S) -> Self {
        Self {
            claims: GroupCommit::new(Claims(store.clone()), Limits::default()),
            completions: GroupCommit::new(Completions(store.clone()), Limits::default()),
        }
    }

    /// A claim, with the claims made at the same time.
    pub async fn claim(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claims.call((id.clone(), params.clone())).await
    }

    /// A completion, with the completions made at the same time.
    pub async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let completion = Completion::new(lease.clone(), response, retention);
        self.completions.call(completion).await
    }
}

/// Claims, together as one `claim_many`.
struct Claims<S>(S);

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
        Err(lost())
    }
}

/// Completions, together as one `complete_many`.
struct Completions<S>(S);

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
        Err(lost())
    }

    fn bytes(&self, c: &Completion) -> usize {
        c.response.len()
    }
}

/// The positions `0..n` of a batch's records (`id(i)`) in the keys' byte
/// order (ties in the order given): the first of each record, and the
/// later ones of a record named more than once. A batch that locks its
/// rows in this order, the same in every batch, never waits on another in
/// a cycle.
pub fn key_order<'a>(n: usize, id: impl Fn(usize) -> &'a RecordId) -> (Vec<usize>, Vec<usize>) {
    let name = |i: usize| (id(i).scope().as_str(), id(i).key().as_str());
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| name(a).cmp(&name(b)).then(a.cmp(&b)));
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for (pos, &i) in order.iter().enumerate() {
        match pos.checked_sub(1).map(|p| order[p]) {
            Some(prev) if id(prev) == id(i) => later.push(i),
            _ => first.push(i),
        }
    }
    (first, later)
}
