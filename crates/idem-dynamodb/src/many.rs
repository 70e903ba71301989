//! Batches of claims and completions. DynamoDB has no batch of
//! conditional writes that succeed or fail one by one (`BatchWriteItem`
//! takes no conditions, a transaction fails whole), so a batch's writes
//! run concurrently, up to [`BATCH_CONCURRENCY`] at a time, each its own
//! conditional write.

use std::collections::HashMap;
use std::future::Future;

use futures_util::StreamExt;
use idem::store::{ClaimOutcome, ClaimParams, Completion};
use idem::{ClaimMany, CompleteMany, RecordId, Store, StoreError};

use crate::store::DynamoStore;

/// How many writes of a batch (`claim_many`, `complete_many`) are in
/// flight at once.
const BATCH_CONCURRENCY: usize = 32;

impl ClaimMany for DynamoStore {
    /// The claims run concurrently (see the module docs). A key that
    /// occurs more than once in the batch is claimed in batch order: each
    /// later occurrence waits for the one before it (it then finds that
    /// claim in progress, as it would in sequence).
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        Ok(in_rounds(claims, |(id, _)| id, |(id, params)| self.claim(id, params)).await)
    }
}

impl CompleteMany for DynamoStore {
    /// The completions run concurrently (see the module docs), each under
    /// its own token check; a record named more than once is completed in
    /// batch order.
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        Ok(in_rounds(
            completions,
            |c| &c.lease.id,
            |c| self.complete(&c.lease, c.response.clone(), c.retention),
        )
        .await)
    }
}

/// `run` for every item, [`BATCH_CONCURRENCY`] at a time, answers in
/// order. Items naming a record named earlier in the batch run in a later
/// round, after it.
async fn in_rounds<'a, T, R, Fut>(
    items: &'a [T],
    id: impl Fn(&'a T) -> &'a RecordId,
    run: impl Fn(&'a T) -> Fut,
) -> Vec<R>
where
    Fut: Future<Output = R> + 'a,
{
    let mut seen: HashMap<&RecordId, usize> = HashMap::new();
    let rounds: Vec<usize> = items
        .iter()
        .map(|item| {
            let n = seen.entry(id(item)).or_default();
            *n += 1;
            *n - 1
        })
        .collect();
    let mut results: Vec<Option<R>> = items.iter().map(|_| None).collect();
    for round in 0..rounds.iter().max().map_or(0, |r| r + 1) {
        let mut in_flight = futures_util::stream::FuturesUnordered::new();
        let mut pending = items
            .iter()
            .enumerate()
            .filter(|(i, _)| rounds[*i] == round);
        loop {
            while in_flight.len() < BATCH_CONCURRENCY {
                let Some((i, item)) = pending.next() else {
                    break;
                };
                let answer = run(item);
                in_flight.push(async move { (i, answer.await) });
            }
            let Some((i, result)) = in_flight.next().await else {
                break;
            };
            results[i] = Some(result);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every item ran in its round"))
        .collect()
}
