//! [`MemoryStoreBuilder`]: defaults and limits.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashTable;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::clock::{Clock, SystemClock};
use crate::memory::horizon::Horizon;
use crate::memory::shard::{Shard, ShardState};
use crate::memory::store::Inner;
use crate::MemoryStore;

/// The default number of shards.
pub const DEFAULT_SHARDS: usize = 64;

/// The default maximum number of records.
pub const DEFAULT_MAX_RECORDS: usize = 1_000_000;

/// Builds a [`MemoryStore`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder<C: Clock = SystemClock> {
    clock: C,
    shards: usize,
    max_records: usize,
    memory: Option<Duration>,
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
            memory: None,
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
            memory: self.memory,
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

    /// Remembers the keys of completed and failed records for `memory`
    /// after their records expire, so a late retry is answered
    /// [`Forgotten`](crate::store::ClaimOutcome::Forgotten) instead of run
    /// again ([`crate::horizon`]; default: not remembered). Kept per day,
    /// dropped a day at a time by the purge, and bounded like the records
    /// (at [`max_records`](Self::max_records) keys the oldest day goes).
    pub fn remember_expired(mut self, memory: Duration) -> Self {
        self.memory = (!memory.is_zero()).then_some(memory);
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
                    horizon: Horizon::default(),
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
                memory: self.memory,
                pending: Mutex::default(),
            }),
        }
    }
}
