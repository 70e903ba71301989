//! Reading, deleting, listing and purging records, and finding abandoned
//! ones.

use std::time::Duration;

use crate::clock::Clock;
use crate::key::{RecordId, Scope};
use crate::record::{Record, State};
use crate::store::{
    DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, PurgeExpired,
    RecordTtl, StoreError,
};
use crate::MemoryStore;

impl<C: Clock> GetRecord for MemoryStore<C> {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let (hash, index) = self.locate(id);
        let shard = self.inner.shards[index].state.lock();
        Ok(shard
            .record(hash, id)
            .filter(|r| !r.is_expired(now))
            .cloned())
    }
}

impl<C: Clock> RecordTtl for MemoryStore<C> {
    async fn ttl(&self, id: &RecordId, response: &[u8]) -> Result<Option<Duration>, StoreError> {
        let now = self.now();
        Ok(self
            .get(id)
            .await?
            .filter(|r| r.state.completed_with(response))
            .map(|r| r.expires_at.since(now)))
    }
}

impl<C: Clock> DeleteRecord for MemoryStore<C> {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let (hash, index) = self.locate(id);
        let shard = &self.inner.shards[index];
        let remembers = self.inner.memory.is_some();
        let removed = {
            let mut state = shard.state.lock();
            match state
                .records
                .find_entry(hash, |(h, k, _)| *h == hash && k == id)
            {
                // An expired record is left to the purge, which remembers
                // it; deleting it here would forget its key.
                Ok(entry) if remembers && entry.get().2.is_expired(now) => None,
                Ok(entry) => {
                    let removed = entry.remove().0 .2;
                    state.journals.remove(id);
                    Some(removed)
                }
                Err(_) => None,
            }
        };
        shard.notify();
        Ok(removed.is_some_and(|r| !r.is_expired(now)))
    }
}

impl<C: Clock> ListRecords for MemoryStore<C> {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let found = self.matching(|id, r| {
            !r.is_expired(now)
                && query.state.is_none_or(|s| r.state.kind() == s)
                && query.scope.as_ref().is_none_or(|s| id.scope() == s)
                && query.after.as_ref().is_none_or(|after| id > after)
        });
        Ok(ListPage::first_of(found, query.limit.max(1)))
    }
}

impl<C: Clock> FindAbandoned for MemoryStore<C> {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let mut found = self.matching(|id, r| id.scope() == scope && r.is_abandoned(now));
        found.sort_by_key(|(_, r)| match r.state {
            State::InProgress { lease_until, .. } => lease_until,
            _ => now,
        });
        found.truncate(limit);
        Ok(found)
    }
}

impl<C: Clock> PurgeExpired for MemoryStore<C> {
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        tokio::task::coop::consume_budget().await;
        Ok(self.purge_now(limit))
    }
}
