//! Batches: many claims (`sql/claim_many.sql`) or many completions
//! (`sql/complete_many.sql`) in one statement, rows locked in the keys'
//! byte order, the same in every batch, so two batches never wait on each
//! other in a cycle. A statement PostgreSQL refuses and rolls back for
//! what one item may have caused (a lock or statement timeout on a row, a
//! deadlock with another session's writes, one item it cannot take) is run
//! again item by item, so one item's trouble never fails its neighbours.

use idem::{ClaimMany, CompleteMany, RecordId, StoreError};

use idem::store::{ClaimOutcome, ClaimParams, Completion, LeaseToken};

use tokio_postgres::types::ToSql;

use crate::encode;
use crate::encode::{ms, token_bytes};
use crate::error::one_item_may_cause;
use crate::store::PgStore;
use idem::group::{claims_or_each, completions_or_each, key_order, Direct};

impl ClaimMany for PgStore {
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(memory) = self.remembers_expired() {
            // A schema that remembers claims each key on its own
            // (sql/claim_remembering.sql has no batch form yet).
            let mut outcomes = Vec::with_capacity(claims.len());
            for (id, params) in claims {
                outcomes.push(if idem::horizon::remembered_scope(id.scope().as_str()) {
                    self.claim_remembering(id, params, memory).await
                } else {
                    self.claim_one(id, params).await
                });
            }
            return Ok(outcomes);
        }
        let batch = self.batch(claims).await;
        claims_or_each(self, claims, batch, one_item_may_cause).await
    }
}

impl CompleteMany for PgStore {
    /// One statement completes the first completion of each record, its
    /// rows locked in the keys' byte order (as `claim_many` locks them);
    /// a record named again later in the batch is completed singly after
    /// it, in the order given, as single calls would be. The statement
    /// commits on its own.
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        if completions.is_empty() {
            return Ok(Vec::new());
        }
        let batch = self.complete_distinct(completions).await;
        completions_or_each(self, completions, batch, one_item_may_cause).await
    }
}

impl PgStore {
    /// The statement for the first completion of each record: `Some`
    /// answer for those, `None` for the later ones of a record named more
    /// than once.
    async fn complete_distinct(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Option<Result<(), StoreError>>>, StoreError> {
        let name = |i: usize| {
            let id = &completions[i].lease.id;
            (id.scope().as_str(), id.key().as_str())
        };
        let (order, _later) = key_order(completions.len(), |i| &completions[i].lease.id);
        let scopes: Vec<&str> = order.iter().map(|&i| name(i).0).collect();
        let keys: Vec<&str> = order.iter().map(|&i| name(i).1).collect();
        let raw_tokens: Vec<[u8; 16]> = order
            .iter()
            .map(|&i| token_bytes(completions[i].lease.token))
            .collect();
        let tokens: Vec<&[u8]> = raw_tokens.iter().map(|t| &t[..]).collect();
        let responses: Vec<&[u8]> = order
            .iter()
            .map(|&i| &completions[i].response[..])
            .collect();
        let keeps: Vec<f64> = order
            .iter()
            .map(|&i| ms(completions[i].retention))
            .collect();
        // A batch where some completion marks its run pending writes the
        // pending index in the same statement; one where none does runs
        // the plain statement.
        let holds: Vec<Option<f64>> = order
            .iter()
            .map(|&i| completions[i].pending.map(ms))
            .collect();
        let marks = holds.iter().any(Option::is_some);
        let client = self.client().await?;
        let rows = if marks {
            let sql = &self.inner.sql.complete_many_pending;
            let statement = self.prepare(&client, sql).await?;
            let params: [&(dyn ToSql + Sync); 6] =
                [&scopes, &keys, &tokens, &responses, &keeps, &holds];
            self.timed(client.query(&statement, &params)).await?
        } else {
            let statement = self.prepare(&client, &self.inner.sql.complete_many).await?;
            let params: [&(dyn ToSql + Sync); 5] = [&scopes, &keys, &tokens, &responses, &keeps];
            self.timed(client.query(&statement, &params)).await?
        };
        let mut results: Vec<Option<Result<(), StoreError>>> =
            (0..completions.len()).map(|_| None).collect();
        for &i in &order {
            results[i] = Some(Err(StoreError::LeaseLost));
        }
        for row in &rows {
            let slot = row
                .try_get::<_, i64>("n")
                .ok()
                .and_then(|n| usize::try_from(n).ok()?.checked_sub(1))
                .and_then(|slot| order.get(slot))
                .ok_or_else(|| {
                    StoreError::Backend("complete_many answered an unknown completion".into())
                })?;
            results[*slot] = Some(Ok(()));
        }
        Ok(results)
    }

    /// One `claim_many` statement for the first claim of each key, keys in
    /// byte order; then, one by one and in the order given, the
    /// claims it could not answer and the later claims of a key that occurs
    /// more than once. The statement commits on its own, so a claim made
    /// after it that fails is an error for that claim alone: the claims the
    /// statement acquired are still returned.
    async fn batch(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        let client = self.client().await?;
        let name = |i: usize| (claims[i].0.scope().as_str(), claims[i].0.key().as_str());
        let (first, later) = key_order(claims.len(), |i| &claims[i].0);
        let tokens: Vec<LeaseToken> = first.iter().map(|_| self.inner.tokens.next()).collect();
        let scopes: Vec<&str> = first.iter().map(|&i| name(i).0).collect();
        let keys: Vec<&str> = first.iter().map(|&i| name(i).1).collect();
        let fingerprints: Vec<Option<&[u8]>> = first
            .iter()
            .map(|&i| claims[i].1.fingerprint.as_ref().map(|f| &f.as_bytes()[..]))
            .collect();
        let raw_tokens: Vec<[u8; 16]> = tokens.iter().map(|&t| token_bytes(t)).collect();
        let token_refs: Vec<&[u8]> = raw_tokens.iter().map(|t| &t[..]).collect();
        let leases: Vec<f64> = first.iter().map(|&i| ms(claims[i].1.lease)).collect();
        let keeps: Vec<f64> = first.iter().map(|&i| ms(claims[i].1.retention)).collect();
        let statement = self.prepare(&client, &self.inner.sql.claim_many).await?;
        let rows = self
            .timed(client.query(
                &statement,
                &[&scopes, &keys, &fingerprints, &token_refs, &leases, &keeps],
            ))
            .await?;
        let mut results: Vec<Option<Result<ClaimOutcome, StoreError>>> =
            (0..claims.len()).map(|_| None).collect();
        for answer in &rows {
            let slot = answer
                .try_get::<_, i64>("n")
                .ok()
                .and_then(|n| usize::try_from(n).ok()?.checked_sub(1))
                .filter(|&slot| slot < first.len())
                .ok_or_else(|| {
                    StoreError::Backend("claim_many answered an unknown claim".into())
                })?;
            let (i, token) = (first[slot], tokens[slot]);
            let (id, params) = &claims[i];
            results[i] =
                encode::claim_outcome(Some(answer), id, token, params.fingerprint).transpose();
        }
        for &i in first.iter().chain(&later) {
            if results[i].is_none() {
                let (id, params) = &claims[i];
                results[i] = Some(match self.prepare(&client, &self.inner.sql.claim).await {
                    Ok(single) => self.claim_on(&**client, &single, id, params).await,
                    Err(e) => Err(e),
                });
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::Backend("claim missing from batch".into()))))
            .collect())
    }
}
