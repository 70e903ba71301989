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
    /// `cap` keys, a key of the oldest day is forgotten first (the memory
    /// is bounded like the records).
    pub(crate) fn remember(&mut self, entry: Forgotten, cap: usize) {
        while self.entries.len() >= cap && !self.entries.contains_key(&entry.digest) {
            let Some(mut oldest) = self.days.first_entry() else {
                break;
            };
            let day = *oldest.key();
            match oldest.get_mut().pop() {
                Some(digest) => {
                    if self.entries.get(&digest).is_some_and(|e| e.day == day) {
                        self.entries.remove(&digest);
                    }
                }
                None => {
                    oldest.remove();
                }
            }
        }
        self.entries.insert(entry.digest, entry);
        self.days.entry(entry.day).or_default().push(entry.digest);
    }

    /// Whether nothing is remembered.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
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

    #[cfg(test)]
    fn days_held(&self) -> usize {
        self.days.len()
    }

    /// How many keys are remembered.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8, day: u32) -> Forgotten {
        Forgotten {
            digest: [n; 16],
            fingerprint: [0; 8],
            day,
        }
    }

    #[test]
    fn at_its_cap_the_memory_forgets_a_key_of_its_oldest_day_not_the_day() {
        let mut horizon = Horizon::default();
        for n in 0..4 {
            horizon.remember(entry(n, 10), 4);
        }
        horizon.remember(entry(9, 11), 4);
        assert_eq!(horizon.len(), 4);
        assert!(horizon.recall(&[9; 16]).is_some());
        assert_eq!(
            (0..4)
                .filter(|n| horizon.recall(&[*n; 16]).is_some())
                .count(),
            3,
            "one key of day 10 gave way"
        );
        assert_eq!(horizon.days_held(), 2);
        horizon.drop_before(11);
        assert_eq!(horizon.len(), 1);
    }
}
