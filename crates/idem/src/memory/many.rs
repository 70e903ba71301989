//! Batches: each call of a batch decided as a single call would be.

use crate::clock::Clock;
use crate::key::RecordId;
use crate::record::{ClaimOutcome, ClaimParams};
use crate::store::{ClaimMany, CompleteMany, Completion, StoreError};
use crate::MemoryStore;

impl<C: Clock> ClaimMany for MemoryStore<C> {
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        tokio::task::coop::consume_budget().await;
        Ok(claims.iter().map(|(id, p)| self.claim_now(id, p)).collect())
    }
}

impl<C: Clock> CompleteMany for MemoryStore<C> {
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        tokio::task::coop::consume_budget().await;
        Ok(completions.iter().map(|c| self.complete_now(c)).collect())
    }
}
