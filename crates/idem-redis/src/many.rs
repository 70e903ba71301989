//! Batches: claims and completions sent together, one primitive's calls
//! at a time.

use idem::{ClaimMany, ClaimOutcome, ClaimParams, CompleteMany, Completion, RecordId, StoreError};
use redis::Value;

use crate::call::{Call, Op};
use crate::{damaged, record, written, LeaseToken, RedisStore};

impl RedisStore {
    /// Runs `calls` of one primitive together, replies in order: in one
    /// batch on a single server, grouped by slot on a Cluster (see
    /// [`run_each`](Self::run_each)).
    async fn primitives(&self, calls: Vec<Call>) -> Vec<Result<Value, StoreError>> {
        if let Some(batcher) = &self.inner.batcher {
            return batcher.call_all(calls).await;
        }
        let Some(op) = calls.first().map(|c| c.op) else {
            return Vec::new();
        };
        let calls: Vec<(String, Vec<Vec<u8>>)> = calls
            .into_iter()
            .map(|c| (c.key, c.args.iter().map(|a| a.to_vec()).collect()))
            .collect();
        self.run_each(self.inner.scripts.primitive(op), &calls)
            .await
    }
}

impl ClaimMany for RedisStore {
    /// Sends the claims together: one pipeline to a single server; on a
    /// Cluster, grouped by slot, the groups all at once (each node's
    /// connection pipelines its share). Claims of one key are answered in
    /// the order given.
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        let tokens: Vec<LeaseToken> = claims.iter().map(|_| self.fresh_token()).collect();
        let calls: Vec<Call> = claims
            .iter()
            .zip(&tokens)
            .map(|((id, params), token)| self.claim_call(id, *token, params))
            .collect();
        let replies = self.primitives(calls).await;
        Ok(claims
            .iter()
            .zip(tokens)
            .zip(replies)
            .map(|(((id, _), token), reply)| {
                record::claim_outcome(id, token, reply.map_err(|e| damaged(id, e))?)
            })
            .collect())
    }
}

impl CompleteMany for RedisStore {
    /// Sends the completions together, as [`ClaimMany`] sends claims: one
    /// batch script call to a single server (group commit, see the crate
    /// docs), grouped by slot on a Cluster. Each is checked against its
    /// own token.
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let calls: Vec<Call> = completions
            .iter()
            .map(|c| {
                let args = self.completion_args(c.response.clone(), c.retention);
                self.holder_call(Op::Complete, &c.lease, args)
            })
            .collect();
        let replies = self.primitives(calls).await;
        Ok(completions
            .iter()
            .zip(replies)
            .map(|(c, reply)| written(&c.lease.id, reply.map_err(|e| damaged(&c.lease.id, e))?))
            .collect())
    }
}
