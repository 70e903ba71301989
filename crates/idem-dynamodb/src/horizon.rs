//! Keys remembered past their retention ([`idem::horizon`]) on DynamoDB.
//!
//! The memory lives in the record's own item, in three attributes that a
//! remembering store's `complete` and `fail` write in the same
//! `UpdateItem` as the end: `hd` (the day the retention ends), `hf` (the
//! fingerprint, copied from `fp` by the update itself) and `hu` (until
//! when it is kept: the end of that day plus the memory, in ms). The
//! item's `sweep_at` moves to `hu`, so DynamoDB's TTL keeps it as long.
//!
//! The memory describes itself, so every client of the table (of this
//! version or later: upgrade them all before turning it on) honours it,
//! whether or not it remembers itself: a claim's first write refuses an
//! item whose memory still runs (`hu > :now`) as it refuses a live one,
//! and the item that comes back is weighed by [`late_retry`]. The purge
//! strips an expired item that remembers down to its memory (a tombstone
//! keeping the fence) instead of deleting it; DynamoDB's TTL removes it
//! once the memory ends (the purge too, [`TTL_LAG`] later, for a table
//! without TTL). A claim that runs a new request under the key carries
//! the memory into the new item; a delete of a live record, and the
//! resolution that releases a parked one, forget it. A new request's
//! later writes set `sweep_at` by its own retention, and the purge's
//! strip puts it back to the memory's end: on a table where no purge
//! runs, a memory carried under a reused key whose new request never
//! ended may be swept by TTL with that request's record.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use idem::horizon::{self, Forgotten, DAY_MS};
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Fingerprint, RecordId, Timestamp};

use crate::encode::{n, s, Item, Stored};
use crate::store::DynamoStore;

/// The condition of a claim's first write: no item, or an expired one
/// below our fence whose memory (if any) has run out.
pub(crate) const CLAIMABLE: &str =
    "attribute_not_exists(pk) OR (ex <= :now AND fe < :fe AND NOT (hu > :now))";

/// `hf` for a record that had no fingerprint.
const NO_FINGERPRINT: &str = "none";

/// How long DynamoDB's TTL may take to delete an item past its `sweep_at`
/// (48 hours, AWS says): the purge deletes a memory that ended only this
/// long after, so that on a table with TTL the deletion is TTL's (free)
/// and the purge's only where TTL is off.
pub(crate) const TTL_LAG: Duration = Duration::from_secs(48 * 3600);

/// The memory an item keeps, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Memory {
    /// The day the remembered record expired (`hd`).
    pub(crate) day: u32,
    /// Its fingerprint as stored (`hf`: hex, or [`NO_FINGERPRINT`]).
    pub(crate) fingerprint: String,
    /// Until when it is kept (`hu`).
    pub(crate) until: Timestamp,
}

impl Memory {
    /// The memory `item` keeps, if any.
    pub(crate) fn of(item: &Item) -> Result<Option<Self>, String> {
        let Some(until) = item.get("hu") else {
            return Ok(None);
        };
        let number = |v: &AttributeValue, name: &str| -> Result<u64, String> {
            v.as_n()
                .ok()
                .and_then(|raw| raw.parse().ok())
                .ok_or_else(|| format!("attribute {name} is not an unsigned integer"))
        };
        let day = item.get("hd").ok_or("a memory has no day (hd)")?;
        let fingerprint = item
            .get("hf")
            .and_then(|v| v.as_s().ok())
            .ok_or("a memory has no fingerprint (hf)")?;
        Ok(Some(Self {
            day: u32::try_from(number(day, "hd")?).map_err(|_| "attribute hd is out of range")?,
            fingerprint: fingerprint.clone(),
            until: Timestamp::from_millis(number(until, "hu")?),
        }))
    }

    /// The attributes that keep this memory, for an item written whole.
    fn attributes(&self) -> [(&'static str, AttributeValue); 3] {
        [
            ("hd", n(self.day)),
            ("hf", s(self.fingerprint.clone())),
            ("hu", n(self.until.as_millis())),
        ]
    }

    /// What [`idem::horizon`] weighs, for `id`.
    fn entry(&self, id: &RecordId) -> Forgotten {
        let fingerprint = Fingerprint::from_hex(&self.fingerprint);
        Forgotten {
            digest: horizon::digest(id),
            fingerprint: horizon::fingerprint_prefix(fingerprint.as_ref()),
            day: self.day,
        }
    }

    /// The memory this was kept for: from the end of its day to `until`.
    fn length(&self) -> Duration {
        let day_end = (u64::from(self.day) + 1).saturating_mul(DAY_MS);
        Duration::from_millis(self.until.as_millis().saturating_sub(day_end))
    }
}

impl DynamoStore {
    /// How long this store remembers the keys of the records it ends
    /// ([`idem::horizon`]), if at all. Memories other clients of the table
    /// wrote are honoured either way.
    pub fn remembers_expired(&self) -> Option<Duration> {
        self.inner.settings.memory
    }

    /// The extra `SET` actions and values with which a write ending `id`'s
    /// record at `expires` (completed or failed) keeps its memory, and the
    /// item's `sweep_at`; nothing extra, and the usual `sweep_at`, for a
    /// store that does not remember or a scope that is not remembered.
    pub(crate) fn ending(
        &self,
        id: &RecordId,
        expires: Timestamp,
    ) -> (&'static str, Vec<(&'static str, AttributeValue)>, u64) {
        let usual = crate::encode::ttl(expires, self.grace_secs());
        let memory = self
            .inner
            .settings
            .memory
            .filter(|_| horizon::remembered_scope(id.scope().as_str()));
        let Some(memory) = memory else {
            return ("", Vec::new(), usual);
        };
        let day = horizon::day_of(expires);
        let until = (u64::from(day) + 1)
            .saturating_mul(DAY_MS)
            .saturating_add(u64::try_from(memory.as_millis()).unwrap_or(u64::MAX));
        (
            ", hd = :hd, hf = if_not_exists(fp, :nofp), hu = :hu",
            vec![
                (":hd", n(day)),
                (":nofp", s(NO_FINGERPRINT)),
                (":hu", n(until)),
            ],
            usual.max(until.div_ceil(1000)),
        )
    }
}

/// Carries the memory `seen` keeps into `item`, the next state of its key
/// written whole, and keeps the item in DynamoDB for as long.
pub(crate) fn carry(item: &mut Item, seen: &Stored) {
    let Some(memory) = &seen.memory else {
        return;
    };
    for (name, value) in memory.attributes() {
        item.insert(name.into(), value);
    }
    let sweep = item
        .get("sweep_at")
        .and_then(|v| v.as_n().ok())
        .and_then(|raw| raw.parse::<u64>().ok())
        .unwrap_or(0);
    let kept = memory.until.as_millis().div_ceil(1000);
    item.insert("sweep_at".into(), n(sweep.max(kept)));
}

/// Drops from `seen` the memory its own record left when it ended, for a
/// write that makes the record never have ended (a parked record
/// released by its resolution).
pub(crate) fn forget_own(id: &RecordId, seen: &mut Stored) {
    let own = seen
        .memory
        .as_ref()
        .is_some_and(|memory| Forgotten::of(id, &seen.record) == Some(memory.entry(id)));
    if own {
        seen.memory = None;
    }
}

/// The answer to a claim of `id` that found `seen` expired, if it is a
/// late retry its memory refuses ([`horizon::late_retry`]).
pub(crate) fn late_retry(
    id: &RecordId,
    seen: &Stored,
    params: &ClaimParams,
    now: Timestamp,
) -> Option<ClaimOutcome> {
    let memory = seen.memory.as_ref().filter(|m| m.until > now)?;
    if !seen.record.is_expired(now) {
        return None;
    }
    let entry = memory.entry(id);
    // The expired record itself is weighed only if the memory is its own
    // (so the answer names its exact expiry), not one carried from an
    // earlier request under the key.
    let own = Forgotten::of(id, &seen.record).filter(|own| *own == entry);
    horizon::late_retry(
        id,
        own.map(|_| &seen.record),
        Some(&entry),
        params,
        now,
        memory.length(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_reads_back_and_says_how_long_it_was_kept() {
        let fp = Fingerprint::of_bytes(b"body");
        let memory = Memory {
            day: 20_000,
            fingerprint: fp.to_hex(),
            until: Timestamp::from_millis(20_001 * DAY_MS + 7 * DAY_MS),
        };
        let item: Item = memory
            .attributes()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(Memory::of(&item), Ok(Some(memory.clone())));
        assert_eq!(memory.length(), Duration::from_secs(7 * 86_400));
        let id = RecordId::parse("s", "k").expect("valid");
        assert_eq!(
            memory.entry(&id).fingerprint,
            horizon::fingerprint_prefix(Some(&fp))
        );
        let none = Memory {
            fingerprint: NO_FINGERPRINT.into(),
            ..memory
        };
        assert_eq!(none.entry(&id).fingerprint, [0; 8]);
        assert_eq!(Memory::of(&Item::new()), Ok(None));
        let mut damaged = item;
        damaged.insert("hd".into(), s("x"));
        assert!(Memory::of(&damaged).is_err());
    }
}
