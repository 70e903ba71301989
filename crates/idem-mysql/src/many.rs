//! Batches: many claims (`idem_claim_many`) or many completions
//! (`idem_complete_many`) in one round trip and one transaction, rows
//! locked in the keys' byte order, the same in every batch, so two
//! batches never wait on each other in a cycle. The items travel as one
//! JSON array (binary values in hex, responses in base64). A batch the
//! server rolls back for what one item may have caused (a deadlock, a lock
//! wait timeout, one item's data) is run again item by item, so one
//! item's trouble never fails its neighbours.

use base64::Engine as _;
use idem::group::{claims_or_each, completions_or_each, key_order};
use idem::store::{ClaimOutcome, ClaimParams, Completion};
use idem::{ClaimMany, CompleteMany, RecordId, StoreError};
use mysql_async::{Row, Value};
use serde_json::json;

use crate::encode::{self, ms, token_bytes};
use crate::error::one_item_may_cause;
use crate::sql;
use crate::store::MySqlStore;

impl ClaimMany for MySqlStore {
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(memory) = self.remembers_expired() {
            // A database that remembers claims each key on its own
            // (crate::horizon: a read before, a read after).
            let mut outcomes = Vec::with_capacity(claims.len());
            for (id, params) in claims {
                outcomes.push(if idem::horizon::remembered_scope(id.scope().as_str()) {
                    self.claim_remembering(id, params, memory).await
                } else {
                    self.claim_single(id, params).await
                });
            }
            return Ok(outcomes);
        }
        let batch = self.claim_batch(claims).await;
        claims_or_each(self, claims, batch, one_item_may_cause).await
    }
}

impl CompleteMany for MySqlStore {
    /// One round trip completes the first completion of each record; a
    /// record named again later in the batch is completed singly after
    /// it, in the order given, as single calls would be.
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let batch = self.complete_batch(completions).await;
        completions_or_each(self, completions, batch, one_item_may_cause).await
    }
}

/// The rows of `idem_claim_many`'s answer, each with the position of its
/// item (`n`, from 1).
fn answers(rows: &[Row], items: usize) -> Result<Vec<(usize, &Row)>, StoreError> {
    rows.iter()
        .map(|row| {
            encode::slot(row)
                .filter(|&slot| slot < items)
                .map(|slot| (slot, row))
                .ok_or_else(|| StoreError::Backend("a batch answered an unknown item".into()))
        })
        .collect()
}

impl MySqlStore {
    /// One `idem_claim_many` call for the first claim of each key, keys in
    /// byte order; then, one by one and in the order given, the claims it
    /// could not answer and the later claims of a key named more than once.
    async fn claim_batch(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        let (first, later) = key_order(claims.len(), |i| &claims[i].0);
        let tokens: Vec<_> = first.iter().map(|_| self.inner.tokens.next()).collect();
        let items: Vec<serde_json::Value> = first
            .iter()
            .zip(&tokens)
            .map(|(&i, &token)| {
                let (id, params) = &claims[i];
                json!([
                    id.scope().as_str(),
                    id.key().as_str(),
                    params.fingerprint.map(|f| hex::encode(f.as_bytes())),
                    hex::encode(token_bytes(token)),
                    ms(params.lease),
                    ms(params.retention),
                ])
            })
            .collect();
        let rows = self
            .query(sql::CLAIM_MANY, vec![Value::from(json!(items).to_string())])
            .await?;
        let mut results: Vec<Option<Result<ClaimOutcome, StoreError>>> =
            (0..claims.len()).map(|_| None).collect();
        for (slot, row) in answers(&rows, first.len())? {
            let (i, token) = (first[slot], tokens[slot]);
            let (id, params) = &claims[i];
            results[i] =
                encode::claim_outcome(Some(row), id, token, params.fingerprint).transpose();
        }
        for &i in first.iter().chain(&later) {
            if results[i].is_none() {
                let (id, params) = &claims[i];
                results[i] = Some(self.claim_single(id, params).await);
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::Backend("claim missing from batch".into()))))
            .collect())
    }

    /// The `idem_complete_many` call for the first completion of each
    /// record: `Some` answer for those, `None` for the later ones of a
    /// record named more than once.
    async fn complete_batch(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Option<Result<(), StoreError>>>, StoreError> {
        let (first, _later) = key_order(completions.len(), |i| &completions[i].lease.id);
        let base64 = base64::engine::general_purpose::STANDARD;
        let items: Vec<serde_json::Value> = first
            .iter()
            .map(|&i| {
                let c = &completions[i];
                json!([
                    c.lease.id.scope().as_str(),
                    c.lease.id.key().as_str(),
                    hex::encode(token_bytes(c.lease.token)),
                    base64.encode(&c.response),
                    ms(c.retention),
                ])
            })
            .collect();
        let rows = self
            .query(
                sql::COMPLETE_MANY,
                vec![Value::from(json!(items).to_string())],
            )
            .await?;
        let written = encode::written(rows.first(), first.len())?;
        let mut results: Vec<Option<Result<(), StoreError>>> =
            (0..completions.len()).map(|_| None).collect();
        for (&i, written) in first.iter().zip(written) {
            results[i] = Some(if written {
                Ok(())
            } else {
                Err(StoreError::LeaseLost)
            });
        }
        Ok(results)
    }
}
