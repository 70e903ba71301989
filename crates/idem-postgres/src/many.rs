//! Many completions in one statement (`sql/complete_many.sql`).

use idem::{CompleteMany, Completion, StoreError};

use crate::row::{ms, token_bytes};
use crate::{deadlock, PgStore};

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
        let mut results = match self.complete_distinct(completions).await {
            // Another session's batch locked rows in another order
            // (a single statement's own plan); run it once more.
            Err(e) if deadlock(&e) => self.complete_distinct(completions).await,
            other => other,
        }?;
        for (i, c) in completions.iter().enumerate() {
            if results[i].is_none() {
                let single = idem::Store::complete(self, &c.lease, c.response.clone(), c.retention);
                results[i] = Some(single.await);
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
        let mut order: Vec<usize> = (0..completions.len()).collect();
        order.sort_by(|&a, &b| name(a).cmp(&name(b)).then(a.cmp(&b)));
        order.dedup_by(|later, first| name(*later) == name(*first));
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
        let client = self.client().await?;
        let statement = self.prepare(&client, &self.inner.sql.complete_many).await?;
        let rows = self
            .timed(client.query(&statement, &[&scopes, &keys, &tokens, &responses, &keeps]))
            .await?;
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
}
