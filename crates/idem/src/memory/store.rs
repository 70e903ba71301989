//! [`MemoryStore`] and its `impl Store`: every transition decided by
//! [`crate::machine`] under its shard's lock.

use std::hash::{BuildHasher, RandomState};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hashbrown::hash_table::Entry;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::horizon;
use crate::key::RecordId;
use crate::machine::{decide_claim, decide_write, Fresh, Write};
use crate::memory::shard::Shard;
use crate::purger::PurgerHandle;
use crate::record::{ClaimOutcome, ClaimParams, Failure, Lease, LeaseToken, Record, State};
use crate::store::{Store, StoreError};

/// A sharded in-memory store.
///
/// - Expiry is checked on every read: an expired record behaves as absent
///   before any purge.
/// - Bounded: at `max_records` (enforced per shard, `max_records / shards`
///   each) a claim first evicts expired records of its shard; if none are
///   left it fails with [`StoreError::CapacityExceeded`]. Live records are
///   never evicted, since that would let a duplicate run.
/// - Tokens are unique for the life of the store; fencing numbers come from
///   a per-shard counter, so they rise per key even across expiry and
///   deletion.
///
/// Cloning is cheap and clones share the records.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use idem::store::{ClaimOutcome, ClaimParams};
/// use idem::{MemoryStore, RecordId, Store};
/// use std::time::Duration;
///
/// let store = MemoryStore::new();
/// let id = RecordId::parse("orders", "order-1").unwrap();
/// let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600));
/// let ClaimOutcome::Acquired(lease) = store.claim(&id, &params).await.unwrap() else { panic!() };
/// store.complete(&lease, "done".into(), Duration::from_secs(3600)).await.unwrap();
/// assert_eq!(store.claim(&id, &params).await.unwrap(), ClaimOutcome::Completed("done".into()));
/// # });
/// ```
pub struct MemoryStore<C: Clock = SystemClock> {
    pub(crate) inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for MemoryStore<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: Clock> std::fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("max_records", &self.inner.max_records)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<C> {
    pub(crate) shards: Box<[Shard]>,
    pub(crate) hasher: RandomState,
    pub(crate) clock: C,
    pub(crate) instance: u64,
    pub(crate) max_records: usize,
    pub(crate) per_shard: usize,
    /// How long expired keys are remembered, if at all.
    pub(crate) memory: Option<Duration>,
    /// The outbox's pending index (`pending.rs`).
    pub(crate) pending: parking_lot::Mutex<std::collections::HashMap<RecordId, Mark>>,
}

/// A run's mark in the pending index (`pending.rs`): the fence it was
/// completed under, and until when its holder keeps it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    pub(crate) fence: u64,
    pub(crate) held_until: Timestamp,
}

impl<C: Clock> MemoryStore<C> {
    /// The id's hash and its shard. The shard comes from the bits just
    /// below the top 7 (which the table uses as tags), so neither the
    /// table's bucket bits nor its tags are constant within a shard.
    pub(crate) fn locate(&self, id: &RecordId) -> (u64, usize) {
        let hash = self.inner.hasher.hash_one(id);
        let shards = self.inner.shards.len();
        let index = if shards == 1 {
            0
        } else {
            ((hash << 7) >> (64 - shards.trailing_zeros())) as usize
        };
        (hash, index)
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub(crate) fn claim_now(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = self.now();
        let (hash, index) = self.locate(id);
        let mut guard = self.inner.shards[index].state.lock();
        let shard = &mut *guard;
        let next_seq = shard.seq + 1;
        let fresh = Fresh {
            token: LeaseToken::from_parts(self.inner.instance, (next_seq << 8) | index as u64),
            fence_floor: next_seq,
        };
        let full = shard.records.len() >= self.inner.per_shard;
        let entry = shard
            .records
            .entry(hash, |(h, k, _)| *h == hash && k == id, |(h, _, _)| *h);
        let existing = match &entry {
            Entry::Occupied(e) => Some(&e.get().2),
            Entry::Vacant(_) => None,
        };
        let (write, outcome) = decide_claim(existing, params, now, fresh).into_parts(id);
        let Some(record) = write else {
            return Ok(outcome);
        };
        if let (Some(memory), 1) = (self.inner.memory, record.attempt) {
            // A memory with nothing in it needs no digest to look in.
            let remembered = if shard.horizon.is_empty() {
                None
            } else {
                shard.horizon.recall(&horizon::digest(id))
            };
            if let Some(late) = horizon::late_retry(id, existing, remembered, params, now, memory) {
                return Ok(late);
            }
        }
        if record.attempt == 1 && !shard.journals.is_empty() {
            // A new record: whatever an earlier one journaled is gone.
            shard.journals.remove(id);
        }
        match entry {
            Entry::Occupied(mut e) => e.get_mut().2 = record,
            Entry::Vacant(e) if !full => {
                e.insert((hash, id.clone(), record));
            }
            Entry::Vacant(_) => {
                // Full: make room from expired records of this shard only.
                shard.remove_expired(now, usize::MAX, self.inner.memory, self.inner.per_shard);
                if shard.records.len() >= self.inner.per_shard {
                    return Err(StoreError::CapacityExceeded {
                        capacity: self.inner.max_records,
                    });
                }
                shard
                    .records
                    .insert_unique(hash, (hash, id.clone(), record), |(h, _, _)| *h);
            }
        }
        shard.seq = next_seq;
        Ok(outcome)
    }

    pub(crate) fn write_now(&self, lease: &Lease, write: Write) -> Result<Timestamp, StoreError> {
        let now = self.now();
        let (hash, index) = self.locate(&lease.id);
        let shard = &self.inner.shards[index];
        let notify = !matches!(write, Write::Extend { .. });
        let lease_until = {
            let mut state = shard.state.lock();
            let slot = state
                .records
                .find_mut(hash, |(h, k, _)| *h == hash && *k == lease.id);
            let next = decide_write(slot.as_ref().map(|(_, _, r)| r), lease.token, write, now)?;
            let until = match next.state {
                State::InProgress { lease_until, .. } => lease_until,
                _ => now,
            };
            if let Some((_, _, existing)) = slot {
                *existing = next;
            }
            until
        };
        if notify {
            shard.notify();
        }
        Ok(lease_until)
    }

    /// Starts a background task (on the current tokio runtime) that purges
    /// expired records every `every`, in batches of `batch` (see
    /// [`spawn_purger`](crate::spawn_purger)). Stops when the handle is
    /// dropped.
    pub fn spawn_purger(&self, every: Duration, batch: usize) -> PurgerHandle {
        crate::spawn_purger(self.clone(), every, batch)
    }

    /// Every record `keep` accepts, shard by shard, unordered.
    pub(crate) fn matching(
        &self,
        keep: impl Fn(&RecordId, &Record) -> bool,
    ) -> Vec<(RecordId, Record)> {
        let mut found = Vec::new();
        for shard in self.inner.shards.iter() {
            let shard = shard.state.lock();
            found.extend(
                shard
                    .records
                    .iter()
                    .filter(|(_, id, r)| keep(id, r))
                    .map(|(_, id, r)| (id.clone(), r.clone())),
            );
        }
        found
    }

    pub(crate) fn purge_now(&self, limit: usize) -> usize {
        let now = self.now();
        let mut removed = 0;
        for shard in self.inner.shards.iter() {
            if removed >= limit {
                break;
            }
            removed += shard.state.lock().remove_expired(
                now,
                limit - removed,
                self.inner.memory,
                self.inner.per_shard,
            );
        }
        removed
    }

    /// How many records are held, including expired ones not yet purged.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.state.lock().records.len())
            .sum()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many expired keys are remembered
    /// ([`remember_expired`](crate::MemoryStoreBuilder::remember_expired)).
    pub fn remembered(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.state.lock().horizon.len())
            .sum()
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    crate::store_capabilities!(peek, steps, pending);

    fn local_now(&self) -> Option<Timestamp> {
        Some(self.inner.clock.now())
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        // Every call finishes without waiting, so a loop of them would never
        // give its worker thread back to the runtime: each call is a yield
        // point under tokio's cooperative budget (as tokio's own types are).
        tokio::task::coop::consume_budget().await;
        self.claim_now(id, params)
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        tokio::task::coop::consume_budget().await;
        self.write_now(
            lease,
            Write::Complete {
                response,
                retention,
            },
        )
        .map(drop)
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        tokio::task::coop::consume_budget().await;
        self.write_now(lease, Write::Fail { failure, retention })
            .map(drop)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        tokio::task::coop::consume_budget().await;
        self.write_now(lease, Write::Extend { lease: duration })
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        tokio::task::coop::consume_budget().await;
        self.write_now(lease, Write::Release).map(drop)
    }

    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        let (hash, index) = self.locate(id);
        let shard = &self.inner.shards[index];
        shard.waiters.fetch_add(1, Ordering::AcqRel);
        let mut notified = pin!(shard.changed.notified());
        notified.as_mut().enable();
        let now = self.now();
        let busy = matches!(
            shard.state.lock().record(hash, id),
            Some(Record { state: State::InProgress { .. }, expires_at, .. }) if now < *expires_at
        );
        if busy {
            let _ = tokio::time::timeout(timeout, notified).await;
        }
        shard.waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::PurgeExpired;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn full_store_evicts_only_expired_records() {
        let clock = ManualClock::default();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(1)
            .max_records(2)
            .build();
        let p = ClaimParams::new(Duration::from_secs(1), Duration::from_secs(10));
        let id = |k: &str| RecordId::parse("s", k).expect("valid");
        block_on(async {
            assert!(matches!(
                store.claim(&id("a"), &p).await,
                Ok(ClaimOutcome::Acquired(_))
            ));
            assert!(matches!(
                store.claim(&id("b"), &p).await,
                Ok(ClaimOutcome::Acquired(_))
            ));
            let err = store.claim(&id("c"), &p).await.expect_err("full");
            assert!(matches!(err, StoreError::CapacityExceeded { capacity: 2 }));
            assert!(err.to_string().contains("2 live records"));
            clock.advance(Duration::from_secs(10));
            assert!(matches!(
                store.claim(&id("c"), &p).await,
                Ok(ClaimOutcome::Acquired(_))
            ));
            assert_eq!(store.len(), 1, "both expired records were evicted");
        });
    }

    #[test]
    fn purge_is_bounded() {
        let clock = ManualClock::default();
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let p = ClaimParams::new(Duration::from_secs(1), Duration::from_secs(1));
        block_on(async {
            for i in 0..10 {
                let id = RecordId::parse("s", &format!("k{i}")).expect("valid");
                store.claim(&id, &p).await.expect("claim");
            }
            clock.advance(Duration::from_secs(2));
            assert_eq!(store.purge_expired(4).await.expect("purge"), 4);
            assert_eq!(store.len(), 6);
            assert_eq!(store.purge_expired(100).await.expect("purge"), 6);
            assert!(store.is_empty());
        });
    }

    #[test]
    fn background_purger_runs_and_stops_on_drop() {
        let clock = ManualClock::default();
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let p = ClaimParams::new(Duration::from_secs(1), Duration::from_secs(1));
        block_on(async {
            store
                .claim(&RecordId::parse("s", "k").expect("valid"), &p)
                .await
                .expect("claim");
            clock.advance(Duration::from_secs(2));
            let handle = store.spawn_purger(Duration::from_millis(1), 100);
            while !store.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            drop(handle);
        });
    }
}
