//! The step journal, kept beside each record in its shard.

use bytes::Bytes;

use crate::clock::Clock;
use crate::key::RecordId;
use crate::machine::{decide_resolve, decide_step_begin, held};
use crate::record::{Lease, Resolution, Resolved, StepBegin, StepEntry, StepState};
use crate::store::{StepJournal, StoreError};
use crate::MemoryStore;

impl<C: Clock> StepJournal for MemoryStore<C> {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let (hash, index) = self.locate(&lease.id);
        let mut state = self.inner.shards[index].state.lock();
        held(state.record(hash, &lease.id), lease.token, now)?;
        let journal = state.journals.entry(lease.id.clone()).or_default();
        let (write, begun) = decide_step_begin(journal.get(step), lease.attempt);
        if let Some(write) = write {
            journal.insert(step.to_owned(), write);
        }
        Ok(begun)
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let (hash, index) = self.locate(&lease.id);
        let mut state = self.inner.shards[index].state.lock();
        held(state.record(hash, &lease.id), lease.token, now)?;
        state
            .journals
            .entry(lease.id.clone())
            .or_default()
            .insert(step.to_owned(), StepState::Done { result });
        Ok(())
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let (hash, index) = self.locate(id);
        let state = self.inner.shards[index].state.lock();
        if state.record(hash, id).is_none_or(|r| r.is_expired(now)) {
            return Ok(Vec::new());
        }
        Ok(state.journals.get(id).map_or_else(Vec::new, |journal| {
            journal
                .iter()
                .map(|(name, state)| StepEntry {
                    name: name.clone(),
                    state: state.clone(),
                })
                .collect()
        }))
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let (hash, index) = self.locate(id);
        let shard = &self.inner.shards[index];
        {
            let mut state = shard.state.lock();
            let current = state.journals.get(id).and_then(|j| j.get(step));
            let (record, step_state) =
                match decide_resolve(state.record(hash, id), current, resolution, now) {
                    Ok(decided) => decided,
                    Err(why) => return Ok(why),
                };
            let journal = state.journals.entry(id.clone()).or_default();
            match step_state {
                Some(done) => journal.insert(step.to_owned(), done),
                None => journal.remove(step),
            };
            if let Some((_, _, slot)) = state
                .records
                .find_mut(hash, |(h, k, _)| *h == hash && k == id)
            {
                *slot = record;
            }
        }
        shard.notify();
        Ok(Resolved::Released)
    }
}
