//! One shard of the store: its records, its step journals, and the
//! waiters for its records' ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;
use parking_lot::Mutex;
use tokio::sync::Notify;

use std::time::Duration;

use crate::clock::Timestamp;
use crate::horizon::{first_kept_day, Forgotten};
use crate::key::RecordId;
use crate::memory::horizon::Horizon;
use crate::record::{Record, StepState};

pub(crate) struct Shard {
    pub(crate) state: Mutex<ShardState>,
    pub(crate) changed: Notify,
    pub(crate) waiters: AtomicUsize,
}

pub(crate) struct ShardState {
    /// `(hash, id, record)`, placed by the store-wide hash of the id. The
    /// hash is computed once per operation (shared by shard selection and
    /// lookup) and kept, so growing the table never hashes ids again.
    pub(crate) records: HashTable<(u64, RecordId, Record)>,
    /// The step journals of records that have one; an entry lives exactly
    /// as long as its record (dropped when the record is deleted, purged,
    /// evicted or claimed anew as a new record).
    pub(crate) journals: HashMap<RecordId, BTreeMap<String, StepState>>,
    /// Claims that acquired in this shard; never decreases.
    pub(crate) seq: u64,
    /// What is remembered of the records this shard dropped, when the
    /// store remembers expired keys.
    pub(crate) horizon: Horizon,
}

impl ShardState {
    pub(crate) fn record(&self, hash: u64, id: &RecordId) -> Option<&Record> {
        self.records
            .find(hash, |(h, k, _)| *h == hash && k == id)
            .map(|(_, _, r)| r)
    }

    /// Removes expired records (at most `limit`) and their journals,
    /// remembering the ended ones for `memory` if it is set (at most `cap`
    /// keys); returns how many.
    pub(crate) fn remove_expired(
        &mut self,
        now: Timestamp,
        limit: usize,
        memory: Option<Duration>,
        cap: usize,
    ) -> usize {
        let journals = &mut self.journals;
        let horizon = &mut self.horizon;
        let mut removed = 0;
        self.records.retain(|(_, id, r)| {
            if removed < limit && r.is_expired(now) {
                removed += 1;
                if !journals.is_empty() {
                    journals.remove(id);
                }
                if let Some(entry) = memory.and_then(|_| Forgotten::of(id, r)) {
                    horizon.remember(entry, cap);
                }
                false
            } else {
                true
            }
        });
        if let Some(memory) = memory {
            self.horizon.drop_before(first_kept_day(now, memory));
        }
        removed
    }
}

impl Shard {
    pub(crate) fn notify(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            self.changed.notify_waiters();
        }
    }
}
