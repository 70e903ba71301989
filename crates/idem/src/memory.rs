//! [`MemoryStore`]: a sharded in-process store. Fast and exact, but it
//! forgets everything when the process exits: use it for tests, for
//! single-process deduplication of transient work, and as the reference
//! implementation of the contract.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::key::{RecordId, Scope};
use crate::machine::{
    decide_claim, decide_resolve, decide_step_begin, decide_write, held, Fresh, Write,
};
use crate::purger::PurgerHandle;
use crate::record::{
    ClaimOutcome, ClaimParams, Failure, Lease, LeaseToken, Record, Resolution, Resolved, State,
    StepBegin, StepEntry, StepState,
};
use crate::store::{
    ClaimMany, CompleteMany, Completion, DeleteRecord, FindAbandoned, GetRecord, ListPage,
    ListQuery, ListRecords, PurgeExpired, RecordTtl, StepJournal, Store, StoreError,
};

/// The default number of shards.
pub const DEFAULT_SHARDS: usize = 64;
/// The default maximum number of records.
pub const DEFAULT_MAX_RECORDS: usize = 1_000_000;

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
/// use idem::{ClaimOutcome, ClaimParams, MemoryStore, RecordId, Store};
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
    inner: Arc<Inner<C>>,
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

struct Inner<C> {
    shards: Box<[Shard]>,
    hasher: RandomState,
    clock: C,
    instance: u64,
    max_records: usize,
    per_shard: usize,
}

struct Shard {
    state: Mutex<ShardState>,
    changed: Notify,
    waiters: AtomicUsize,
}

struct ShardState {
    /// `(hash, id, record)`, placed by the store-wide hash of the id. The
    /// hash is computed once per operation (shared by shard selection and
    /// lookup) and kept, so growing the table never hashes ids again.
    records: HashTable<(u64, RecordId, Record)>,
    /// The step journals of records that have one; an entry lives exactly
    /// as long as its record (dropped when the record is deleted, purged,
    /// evicted or claimed anew as a new record).
    journals: HashMap<RecordId, BTreeMap<String, StepState>>,
    /// Claims that acquired in this shard; never decreases.
    seq: u64,
}

impl ShardState {
    fn record(&self, hash: u64, id: &RecordId) -> Option<&Record> {
        self.records
            .find(hash, |(h, k, _)| *h == hash && k == id)
            .map(|(_, _, r)| r)
    }

    /// Removes expired records (at most `limit`) and their journals;
    /// returns how many.
    fn remove_expired(&mut self, now: Timestamp, limit: usize) -> usize {
        let journals = &mut self.journals;
        let mut removed = 0;
        self.records.retain(|(_, id, r)| {
            if removed < limit && r.is_expired(now) {
                removed += 1;
                if !journals.is_empty() {
                    journals.remove(id);
                }
                false
            } else {
                true
            }
        });
        removed
    }
}

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder<C: Clock = SystemClock> {
    clock: C,
    shards: usize,
    max_records: usize,
}

impl MemoryStore<SystemClock> {
    /// A store on the system clock with default limits.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder with default limits on the system clock.
    pub fn builder() -> MemoryStoreBuilder<SystemClock> {
        MemoryStoreBuilder {
            clock: SystemClock,
            shards: DEFAULT_SHARDS,
            max_records: DEFAULT_MAX_RECORDS,
        }
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// Reads time from `clock` (a [`ManualClock`](crate::ManualClock) in
    /// tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            clock,
            shards: self.shards,
            max_records: self.max_records,
        }
    }

    /// The number of shards, rounded up to a power of two in 1..=256.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 256).next_power_of_two();
        self
    }

    /// The maximum number of records held (live or not yet purged).
    pub fn max_records(mut self, max_records: usize) -> Self {
        self.max_records = max_records.max(1);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore<C> {
        let shards = (0..self.shards)
            .map(|_| Shard {
                state: Mutex::new(ShardState {
                    records: HashTable::new(),
                    journals: HashMap::new(),
                    seq: 0,
                }),
                changed: Notify::new(),
                waiters: AtomicUsize::new(0),
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                hasher: RandomState::new(),
                clock: self.clock,
                instance: rand::random(),
                max_records: self.max_records,
                per_shard: self.max_records.div_ceil(self.shards),
            }),
        }
    }
}

impl<C: Clock> MemoryStore<C> {
    /// The id's hash and its shard. The shard comes from the bits just
    /// below the top 7 (which the table uses as tags), so neither the
    /// table's bucket bits nor its tags are constant within a shard.
    fn locate(&self, id: &RecordId) -> (u64, usize) {
        let hash = self.inner.hasher.hash_one(id);
        let shards = self.inner.shards.len();
        let index = if shards == 1 {
            0
        } else {
            ((hash << 7) >> (64 - shards.trailing_zeros())) as usize
        };
        (hash, index)
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    fn claim_now(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
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
                shard.remove_expired(now, usize::MAX);
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

    fn write_now(&self, lease: &Lease, write: Write) -> Result<Timestamp, StoreError> {
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
    fn matching(&self, keep: impl Fn(&RecordId, &Record) -> bool) -> Vec<(RecordId, Record)> {
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

    fn purge_now(&self, limit: usize) -> usize {
        let now = self.now();
        let mut removed = 0;
        for shard in self.inner.shards.iter() {
            if removed >= limit {
                break;
            }
            removed += shard.state.lock().remove_expired(now, limit - removed);
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
}

impl Shard {
    fn notify(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.changed.notify_waiters();
        }
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    crate::store_capabilities!(peek, steps);

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
        let removed = {
            let mut state = shard.state.lock();
            state.journals.remove(id);
            match state
                .records
                .find_entry(hash, |(h, k, _)| *h == hash && k == id)
            {
                Ok(entry) => Some(entry.remove().0 .2),
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
        Ok(completions
            .iter()
            .map(|c| {
                let write = Write::Complete {
                    response: c.response.clone(),
                    retention: c.retention,
                };
                self.write_now(&c.lease, write).map(drop)
            })
            .collect())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

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
