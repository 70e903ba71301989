//! A shard's memory of expired keys ([`crate::horizon`]): entries by the
//! digest of their id, and the digests of each day, so a day is dropped
//! whole.

use std::collections::{BTreeMap, HashMap};

use crate::horizon::{Forgotten, IdDigest};

#[derive(Default)]
pub(crate) struct Horizon {
    entries: HashMap<IdDigest, Forgotten>,
    days: BTreeMap<u32, Vec<IdDigest>>,
}

impl Horizon {
    /// Remembers `entry`, in place of what was remembered of its id; at
    /// `cap` keys, the oldest day is dropped first (the memory is bounded
    /// like the records).
    pub(crate) fn remember(&mut self, entry: Forgotten, cap: usize) {
        if self.entries.len() >= cap && !self.entries.contains_key(&entry.digest) {
            if let Some(&oldest) = self.days.keys().next() {
                self.drop_before(oldest.saturating_add(1));
            }
        }
        self.entries.insert(entry.digest, entry);
        self.days.entry(entry.day).or_default().push(entry.digest);
    }

    /// What is remembered of the id with `digest`.
    pub(crate) fn recall(&self, digest: &IdDigest) -> Option<&Forgotten> {
        self.entries.get(digest)
    }

    /// Drops every day before `first_day`.
    pub(crate) fn drop_before(&mut self, first_day: u32) {
        while let Some(entry) = self.days.first_entry() {
            if *entry.key() >= first_day {
                break;
            }
            let (day, digests) = entry.remove_entry();
            for digest in digests {
                if self.entries.get(&digest).is_some_and(|e| e.day == day) {
                    self.entries.remove(&digest);
                }
            }
        }
    }

    /// How many keys are remembered.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}
