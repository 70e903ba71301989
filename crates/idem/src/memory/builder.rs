//! [`MemoryStoreBuilder`]: defaults and limits.

use std::collections::HashMap;
use std::hash::RandomState;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::clock::{Clock, SystemClock};
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
