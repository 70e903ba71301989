//! The outbox's pending index (`migrations/0012_pending.sql`): a sending
//! run's row written by its completion's statement, deleted once its
//! messages are confirmed with the confirmations made at the same time
//! (one call for a batch, each row found by its primary key), and rows
//! taken by dispatchers with `SKIP LOCKED`.

use std::time::Duration;

use bytes::Bytes;
use idem::group::complete_through;
use idem::store::{Completion, Lease, PendingRun, PendingSends};
use idem::{GetRecord, RecordId, Scope, State, StoreError};

use crate::encode::ms;
use crate::store::PgStore;

impl PgStore {
    /// Deletes the rows of `confirmed` runs that still name their fence,
    /// in one statement.
    pub(crate) async fn confirm_now(
        &self,
        confirmed: &[(RecordId, u64)],
    ) -> Result<(), StoreError> {
        let mut order: Vec<&(RecordId, u64)> = confirmed.iter().collect();
        order.sort_by(|a, b| a.0.cmp(&b.0));
        let scopes: Vec<&str> = order.iter().map(|(id, _)| id.scope().as_str()).collect();
        let keys: Vec<&str> = order.iter().map(|(id, _)| id.key().as_str()).collect();
        let fences: Vec<i64> = order.iter().map(|(_, fence)| *fence as i64).collect();
        self.write(&self.inner.sql.pending_confirm, &[&scopes, &keys, &fences])
            .await
            .map(drop)
    }

    /// The runs of `rows`, rows of `scope` just taken (`key`, `fence`):
    /// each run's record is read, a completed one with the row's fence is
    /// taken, any other row is dropped.
    async fn taken(
        &self,
        scope: &Scope,
        rows: Vec<tokio_postgres::Row>,
    ) -> Result<Vec<PendingRun>, StoreError> {
        let mut taken = Vec::with_capacity(rows.len());
        for row in rows {
            let key: String = row.try_get("key").map_err(backend)?;
            let fence: i64 = row.try_get("fence").map_err(backend)?;
            let fence = fence as u64;
            let id = RecordId::new(
                scope.clone(),
                idem::Key::new(&key).map_err(|e| StoreError::Backend(e.into()))?,
            );
            match self.get(&id).await? {
                Some(record) if record.fence == fence => {
                    if let State::Completed { response } = record.state {
                        taken.push(PendingRun {
                            id,
                            fence,
                            response,
                        });
                        continue;
                    }
                    self.confirm_now(&[(id, fence)]).await?;
                }
                _ => self.confirm_now(&[(id, fence)]).await?,
            }
        }
        Ok(taken)
    }
}

fn backend(error: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(Box::new(error))
}

impl PendingSends for PgStore {
    async fn complete_pending(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
        hold: Duration,
    ) -> Result<(), StoreError> {
        let completion = Completion::new(lease.clone(), response, retention).marked_pending(hold);
        complete_through(self.groups.as_deref(), self, completion).await
    }

    async fn confirm_sent(&self, id: &RecordId, fence: u64) -> Result<(), StoreError> {
        match &self.confirms {
            Some(confirms) => confirms.call((id.clone(), fence)).await,
            None => self.confirm_now(&[(id.clone(), fence)]).await,
        }
    }

    async fn take_pending(
        &self,
        scope: &Scope,
        hold: Duration,
        limit: usize,
    ) -> Result<Vec<PendingRun>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                &self.inner.sql.pending_take,
                &[&scope.as_str(), &ms(hold), &limit],
            )
            .await?;
        self.taken(scope, rows).await
    }

    async fn take_pending_run(
        &self,
        id: &RecordId,
        hold: Duration,
    ) -> Result<Option<PendingRun>, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.pending_take_run,
                &[&id.scope().as_str(), &id.key().as_str(), &ms(hold)],
            )
            .await?;
        Ok(self.taken(id.scope(), rows).await?.pop())
    }
}
