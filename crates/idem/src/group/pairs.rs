//! [`Pairs`]: the group commits of a store whose claims and completions
//! have a batch form ([`ClaimMany`], [`CompleteMany`]) beside a single
//! one ([`Direct`]), as the relational stores have: claims made at the
//! same time go as one `claim_many`, completions as one `complete_many`,
//! each still answered on its own; a lone call runs its single form at
//! once. A batch that fails as a whole fails each call in it with the
//! same error.

use std::future::Future;
use std::sync::Arc;

use super::{lost, Batch, GroupCommit, Limits};
use crate::store::{ClaimOutcome, ClaimParams, Completion};
use crate::{ClaimMany, CompleteMany, RecordId, StoreError};

/// What a group sends through: a copy of the store without groups, whose
/// calls go straight to the server, one statement each or one for many.
pub trait Direct: ClaimMany + CompleteMany + Clone + Send + Sync + 'static {
    /// One claim, on its own.
    fn claim_one(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// One completion, on its own (marking the run pending when it says
    /// so, on a store with a pending index).
    fn complete_one(
        &self,
        completion: &Completion,
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
    pub async fn complete(&self, completion: Completion) -> Result<(), StoreError> {
        self.completions.call(completion).await
    }
}

/// A claim through `groups` when the store has them, else on its own.
pub async fn claim_through<S: Direct>(
    groups: Option<&Pairs<S>>,
    store: &S,
    id: &RecordId,
    params: &ClaimParams,
) -> Result<ClaimOutcome, StoreError> {
    match groups {
        Some(groups) => groups.claim(id, params).await,
        None => store.claim_one(id, params).await,
    }
}

/// A completion through `groups` when the store has them, else on its
/// own.
pub async fn complete_through<S: Direct>(
    groups: Option<&Pairs<S>>,
    store: &S,
    completion: Completion,
) -> Result<(), StoreError> {
    match groups {
        Some(groups) => groups.complete(completion).await,
        None => store.complete_one(&completion).await,
    }
}

/// The answers of a batch of `claims`, or, when the batch failed with an
/// error `one_item` says one of its items may have caused alone (the
/// batch was rolled back whole), each claim made on its own, so one
/// item's trouble never fails its neighbours.
pub async fn claims_or_each<S: Direct>(
    store: &S,
    claims: &[(RecordId, ClaimParams)],
    batch: Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError>,
    one_item: impl Fn(&StoreError) -> bool,
) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
    match batch {
        Err(e) if one_item(&e) => {
            tracing::debug!(error = %e, "claim_many rolled back; claiming one by one");
            let mut results = Vec::with_capacity(claims.len());
            for (id, params) in claims {
                results.push(store.claim_one(id, params).await);
            }
            Ok(results)
        }
        other => other,
    }
}

/// The answers of a batch of `completions` (`None` for those it left to
/// be made on their own: the later completions of a record named more
/// than once), each such completion then made on its own, in the order
/// given; when the batch failed with an error `one_item` says one of its
/// items may have caused alone, every completion made on its own.
pub async fn completions_or_each<S: Direct>(
    store: &S,
    completions: &[Completion],
    batch: Result<Vec<Option<Result<(), StoreError>>>, StoreError>,
    one_item: impl Fn(&StoreError) -> bool,
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let mut results = match batch {
        Err(e) if one_item(&e) => {
            tracing::debug!(error = %e, "complete_many rolled back; completing one by one");
            completions.iter().map(|_| None).collect()
        }
        other => other?,
    };
    for (i, c) in completions.iter().enumerate() {
        if results.get(i).is_some_and(Option::is_none) {
            results[i] = Some(store.complete_one(c).await);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| {
            r.unwrap_or(Err(StoreError::Backend(
                "completion missing from batch".into(),
            )))
        })
        .collect())
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
        self.0.complete_one(&c).await
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
