//! The outbox's pending index on the memory store: a mark per run whose
//! messages are not yet confirmed sent, beside the shards.

use std::time::Duration;

use bytes::Bytes;

use crate::clock::{Clock, Timestamp};
use crate::key::{RecordId, Scope};
use crate::machine::Write;
use crate::memory::store::{Mark, MemoryStore};
use crate::record::{Lease, State};
use crate::store::{Completion, PendingRun, PendingSends, StoreError};

impl<C: Clock> MemoryStore<C> {
    /// A completion, marking its run pending when it says so: the mark
    /// is written under the pending lock held across the completion, so
    /// no taker sees the completion without it.
    pub(crate) fn complete_now(&self, completion: &Completion) -> Result<(), StoreError> {
        let lease = &completion.lease;
        let write = || {
            let response = completion.response.clone();
            let retention = completion.retention;
            self.write_now(
                lease,
                Write::Complete {
                    response,
                    retention,
                },
            )
        };
        let Some(hold) = completion.pending else {
            return write().map(drop);
        };
        let mut marks = self.inner.pending.lock();
        write()?;
        let held_until = self.now().saturating_add(hold);
        let fence = lease.fence;
        marks.insert(lease.id.clone(), Mark { fence, held_until });
        Ok(())
    }

    /// The run `id` if its mark's hold ran out at `now` and its record is
    /// still the completion the mark was written with, held now until
    /// `until`. A mark whose record moved on is dropped.
    fn take_if_due(
        &self,
        marks: &mut std::collections::HashMap<RecordId, Mark>,
        id: &RecordId,
        now: Timestamp,
        until: Timestamp,
    ) -> Option<PendingRun> {
        let mark = marks.get_mut(id)?;
        if now < mark.held_until {
            return None;
        }
        let (hash, index) = self.locate(id);
        let response = {
            let shard = self.inner.shards[index].state.lock();
            match shard.record(hash, id) {
                Some(record) if !record.is_expired(now) && record.fence == mark.fence => {
                    match &record.state {
                        State::Completed { response } => Some(response.clone()),
                        _ => None,
                    }
                }
                _ => None,
            }
        };
        let Some(response) = response else {
            marks.remove(id);
            return None;
        };
        mark.held_until = until;
        Some(PendingRun {
            id: id.clone(),
            fence: mark.fence,
            response,
        })
    }
}

impl<C: Clock> PendingSends for MemoryStore<C> {
    async fn complete_pending(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
        hold: Duration,
    ) -> Result<(), StoreError> {
        tokio::task::coop::consume_budget().await;
        self.complete_now(&Completion::new(lease.clone(), response, retention).marked_pending(hold))
    }

    async fn confirm_sent(&self, id: &RecordId, fence: u64) -> Result<(), StoreError> {
        tokio::task::coop::consume_budget().await;
        let mut marks = self.inner.pending.lock();
        if marks.get(id).is_some_and(|mark| mark.fence == fence) {
            marks.remove(id);
        }
        Ok(())
    }

    async fn take_pending(
        &self,
        scope: &Scope,
        hold: Duration,
        limit: usize,
    ) -> Result<Vec<PendingRun>, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let until = now.saturating_add(hold);
        let mut marks = self.inner.pending.lock();
        let ids: Vec<RecordId> = marks
            .keys()
            .filter(|id| id.scope() == scope)
            .cloned()
            .collect();
        let mut taken = Vec::new();
        for id in ids {
            if taken.len() >= limit {
                break;
            }
            taken.extend(self.take_if_due(&mut marks, &id, now, until));
        }
        Ok(taken)
    }

    async fn take_pending_run(
        &self,
        id: &RecordId,
        hold: Duration,
    ) -> Result<Option<PendingRun>, StoreError> {
        tokio::task::coop::consume_budget().await;
        let now = self.now();
        let mut marks = self.inner.pending.lock();
        Ok(self.take_if_due(&mut marks, id, now, now.saturating_add(hold)))
    }
}
