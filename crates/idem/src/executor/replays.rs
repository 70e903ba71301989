//! The executor's replay cache: completed outcomes this process stored,
//! served again from memory without asking the store.
//!
//! A completed record never changes until it expires or is deleted, so
//! its response can be kept where it was produced. The rules:
//!
//! - **Only what this executor completed**, with the fingerprint it was
//!   claimed with: a claim with another fingerprint goes to the store
//!   (which answers `Mismatch`). A replay read from the store is not
//!   cached: the executor does not know how long that record has left
//!   (wrap the store in [`Cached`](crate::cache::Cached) for that).
//! - **Never past the record's retention.** An entry lives for the
//!   retention from the moment its completion was first sent (the store
//!   set the record's expiry later than that), and at most `max_ttl`. On a
//!   store that keeps time on a local clock ([`Store::local_now`]), the
//!   entry also ends when that clock passes the same deadline, so a clock
//!   moved forward (in tests, or a jump) ends it as it ends the record.
//! - **Deletes:** [`Idempotency::forget`](super::Idempotency::forget) and
//!   [`Idempotency::delete`](super::Idempotency::delete) drop an entry at
//!   once. A delete made elsewhere is seen once `max_ttl` has passed.
//! - **Bounded in bytes**, least recently used evicted first.

use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;

/// The default memory for cached replays: 64 MiB.
pub const DEFAULT_REPLAY_CACHE_BYTES: usize = 64 << 20;
/// The default longest time a replay is served from memory: also how long
/// a delete made outside this process may go unseen.
pub const DEFAULT_REPLAY_CACHE_TTL: Duration = Duration::from_secs(60);

/// What an entry costs beyond its key and response bytes (the map's
/// node, the entry's fields).
const OVERHEAD: usize = 96;

struct Entry {
    /// The entry's id (the map is keyed by its hash).
    id: RecordId,
    fingerprint: Option<Fingerprint>,
    response: Bytes,
    /// Past this (monotonic) instant the entry is gone.
    until: Instant,
    /// Past this reading of the store's local clock, too.
    expires: Option<Timestamp>,
    cost: usize,
}

/// The hasher of the map's keys, which are ids hashed already (with the
/// random keys of [`Replays::ids`]): each call hashes its id once, and the
/// map never hashes an id again as it grows.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

struct Entries {
    map: lru::LruCache<u64, Entry, BuildHasherDefault<Prehashed>>,
    bytes: usize,
}

/// Completed replays kept in memory (see the module docs).
pub(crate) struct Replays {
    budget: usize,
    max_ttl: Duration,
    /// Hashes ids for the map (SipHash with random keys: ids come from
    /// clients).
    ids: RandomState,
    entries: Mutex<Entries>,
}

impl Replays {
    /// A cache of at most `budget` bytes whose entries live at most
    /// `max_ttl`; a zero budget or TTL keeps nothing.
    pub(crate) fn new(budget: usize, max_ttl: Duration) -> Self {
        Self {
            budget,
            max_ttl,
            ids: RandomState::new(),
            entries: Mutex::new(Entries {
                map: lru::LruCache::unbounded_with_hasher(BuildHasherDefault::default()),
                bytes: 0,
            }),
        }
    }

    /// Whether it keeps anything at all.
    pub(crate) fn is_on(&self) -> bool {
        self.budget > 0 && !self.max_ttl.is_zero()
    }

    /// The response of `id` completed with `fingerprint`, if it is here
    /// and still live; `store_now` is the store's local clock, if it has
    /// one.
    pub(crate) fn get(
        &self,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
        store_now: impl FnOnce() -> Option<Timestamp>,
    ) -> Option<Bytes> {
        if !self.is_on() {
            return None;
        }
        let hash = self.ids.hash_one(id);
        let mut entries = self.entries.lock();
        let entry = entries.map.get(&hash).filter(|e| e.id == *id)?;
        let live = Instant::now() < entry.until
            && match (entry.expires, store_now()) {
                (Some(expires), Some(now)) => now < expires,
                _ => true,
            };
        if !live {
            entries.remove(hash);
            return None;
        }
        (entry.fingerprint == fingerprint).then(|| entry.response.clone())
    }

    /// Keeps `response`, completed for `id` with `fingerprint` and
    /// `retention` by a completion first sent at `sent` (when the store's
    /// local clock, if any, read `store_sent`).
    pub(crate) fn put(
        &self,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
        response: Bytes,
        retention: Duration,
        sent: (Instant, Option<Timestamp>),
    ) {
        let cost = OVERHEAD + id.scope().as_str().len() + id.key().as_str().len() + response.len();
        // One entry never takes more than a sixteenth of the budget.
        if !self.is_on() || cost > self.budget / 16 {
            return;
        }
        let Some(until) = sent.0.checked_add(retention.min(self.max_ttl)) else {
            return;
        };
        if until <= Instant::now() {
            return;
        }
        let hash = self.ids.hash_one(id);
        let entry = Entry {
            id: id.clone(),
            fingerprint,
            response,
            until,
            expires: sent.1.map(|t| t.saturating_add(retention)),
            cost,
        };
        let mut entries = self.entries.lock();
        entries.bytes += cost;
        // One lookup: `put` hands back the entry it replaced, if any.
        if let Some(old) = entries.map.put(hash, entry) {
            entries.bytes -= old.cost;
        }
        while entries.bytes > self.budget {
            match entries.map.pop_lru() {
                Some((_, old)) => entries.bytes -= old.cost,
                None => break,
            }
        }
    }

    /// Forgets `id`.
    pub(crate) fn remove(&self, id: &RecordId) {
        let hash = self.ids.hash_one(id);
        let mut entries = self.entries.lock();
        if entries.map.peek(&hash).is_some_and(|e| e.id == *id) {
            entries.remove(hash);
        }
    }

    /// How many entries it holds, and their cost in bytes.
    #[cfg(test)]
    fn size(&self) -> (usize, usize) {
        let entries = self.entries.lock();
        (entries.map.len(), entries.bytes)
    }
}

impl Entries {
    fn remove(&mut self, hash: u64) {
        if let Some(old) = self.map.pop(&hash) {
            self.bytes -= old.cost;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str) -> RecordId {
        RecordId::parse("s", key).expect("valid")
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn serves_only_the_same_fingerprint_until_the_retention_or_max_ttl() {
        let replays = Replays::new(1 << 20, Duration::from_secs(60));
        let fp = Some(Fingerprint::of_bytes(b"a"));
        replays.put(
            &id("k"),
            fp,
            Bytes::from_static(b"r"),
            HOUR,
            (Instant::now(), None),
        );
        assert_eq!(
            replays.get(&id("k"), fp, || None),
            Some(Bytes::from_static(b"r"))
        );
        assert_eq!(replays.get(&id("k"), None, || None), None);
        assert_eq!(replays.get(&id("other"), fp, || None), None);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(replays.get(&id("k"), fp, || None).is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(replays.get(&id("k"), fp, || None), None, "max_ttl");
        assert_eq!(replays.size(), (0, 0));

        replays.put(
            &id("short"),
            None,
            Bytes::new(),
            Duration::from_secs(2),
            (Instant::now(), None),
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(replays.get(&id("short"), None, || None), None, "retention");
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_clock_moved_past_the_retention_ends_the_entry() {
        let replays = Replays::new(1 << 20, Duration::from_secs(60));
        let at = Timestamp::from_millis(1_000_000);
        replays.put(
            &id("k"),
            None,
            Bytes::from_static(b"r"),
            Duration::from_secs(10),
            (Instant::now(), Some(at)),
        );
        let later = |s| move || Some(at.saturating_add(Duration::from_secs(s)));
        assert!(replays.get(&id("k"), None, later(9)).is_some());
        assert_eq!(replays.get(&id("k"), None, later(10)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn holds_at_most_its_budget_evicting_the_least_recently_used() {
        let per = OVERHEAD + 1 + 2 + 100;
        let replays = Replays::new(per * 16 * 3, Duration::from_secs(60));
        let response = Bytes::from(vec![7u8; 100]);
        for k in 0..50 {
            replays.put(
                &id(&format!("{k:02}")),
                None,
                response.clone(),
                HOUR,
                (Instant::now(), None),
            );
            // 00 is used again and again: it stays.
            assert!(replays.get(&id("00"), None, || None).is_some());
        }
        let (len, bytes) = replays.size();
        assert_eq!(len, 48);
        assert_eq!(bytes, 48 * per);
        assert!(replays.get(&id("01"), None, || None).is_none(), "evicted");
        assert!(replays.get(&id("49"), None, || None).is_some());

        replays.put(
            &id("big"),
            None,
            Bytes::from(vec![0u8; per * 3]),
            HOUR,
            (Instant::now(), None),
        );
        assert!(
            replays.get(&id("big"), None, || None).is_none(),
            "over a sixteenth"
        );
        replays.remove(&id("49"));
        assert!(replays.get(&id("49"), None, || None).is_none());
        assert_eq!(replays.size().1, 47 * per);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_budget_keeps_nothing() {
        let replays = Replays::new(0, Duration::from_secs(60));
        replays.put(&id("k"), None, Bytes::new(), HOUR, (Instant::now(), None));
        assert_eq!(replays.get(&id("k"), None, || None), None);
    }
}
