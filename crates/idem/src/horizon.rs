//! After the retention: a compact memory of the keys whose records expired
//! (design §11), so that a late retry is refused instead of run again.
//!
//! A store configured to remember (for how long is its *memory*, far
//! longer than the retention) keeps one [`Forgotten`] for each completed or
//! failed record it drops: a digest of the record's id, the first bytes of
//! the request's fingerprint and the day the record expired — 28 bytes,
//! never the outcome. Entries are kept by day and dropped a whole day at a
//! time once the day is older than the memory.
//!
//! A claim that would start a key afresh asks [`late_retry`]: a key whose
//! record ended (completed or failed) with the same fingerprint, and that
//! expired within the memory, is answered [`ClaimOutcome::Forgotten`]. The
//! same key with another fingerprint is a new request reusing an old key,
//! and runs. A record that expired but is still held (not yet purged)
//! counts as remembered too, so the answer does not depend on when the
//! purge ran.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;
use crate::record::{ClaimOutcome, ClaimParams, Record, State};

/// A day, in milliseconds: the memory's unit.
pub const DAY_MS: u64 = 86_400_000;

/// The digest a memory keeps of a record's id.
pub type IdDigest = [u8; 16];

/// The bytes of a fingerprint a memory keeps (all zero for none).
pub type FingerprintPrefix = [u8; 8];

/// What a store remembers of one key whose record expired (the SQL stores
/// keep the digest's first 8 bytes only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Forgotten {
    /// The digest of the record's id ([`digest`]).
    pub digest: IdDigest,
    /// The first bytes of the record's fingerprint ([`fingerprint_prefix`]).
    pub fingerprint: FingerprintPrefix,
    /// The day the record expired, counted from the Unix epoch.
    pub day: u32,
}

impl Forgotten {
    /// What to remember of `id`'s record as it is dropped: something for a
    /// completed or failed record, nothing for a record that never ended
    /// (released or abandoned: running it again is what its retry must
    /// do).
    pub fn of(id: &RecordId, record: &Record) -> Option<Self> {
        if !remembered_scope(id.scope().as_str()) {
            return None;
        }
        let fingerprint = ended(record)?;
        Some(Self {
            digest: digest(id),
            fingerprint,
            day: day_of(record.expires_at),
        })
    }

    /// The start of the day the record expired (the memory keeps no finer
    /// time).
    pub fn expired_at(&self) -> Timestamp {
        Timestamp::from_millis(u64::from(self.day) * DAY_MS)
    }
}

/// The digest of `id` a memory keeps: the first 16 bytes of a SHA-256 of
/// its scope and key (under a domain of its own). With keys hashed at
/// rest ([`KeyHasher`](crate::key_hash::KeyHasher)) the key is already the
/// keyed hash, so the memory shows no key a client sent.
pub fn digest(id: &RecordId) -> IdDigest {
    digest_of(id.scope().as_str(), id.key().as_str())
}

/// [`digest`] of a scope and key as stored (for a store reading them back
/// as text).
pub fn digest_of(scope: &str, key: &str) -> IdDigest {
    let mut hash = Sha256::new();
    hash.update(b"idem.horizon.v1\0");
    hash.update(scope.as_bytes());
    hash.update([0]);
    hash.update(key.as_bytes());
    let full = hash.finalize();
    let mut out = [0; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// The bytes of `fingerprint` a memory keeps: enough to tell a late retry
/// from a new request under an old key.
pub fn fingerprint_prefix(fingerprint: Option<&Fingerprint>) -> FingerprintPrefix {
    fingerprint_prefix_of(fingerprint.map(|f| &f.as_bytes()[..]))
}

/// [`fingerprint_prefix`] of a fingerprint's bytes as stored (all zero
/// for none, or for bytes too short to be one).
pub fn fingerprint_prefix_of(fingerprint: Option<&[u8]>) -> FingerprintPrefix {
    fingerprint
        .and_then(|bytes| bytes.get(..8)?.try_into().ok())
        .unwrap_or([0; 8])
}

/// The first 8 bytes of `bytes` (a digest, a fingerprint prefix) as the
/// big-endian signed integer the SQL stores keep (shorter input padded
/// with zeros).
pub fn packed(bytes: &[u8]) -> i64 {
    let mut first = [0; 8];
    let n = bytes.len().min(8);
    first[..n].copy_from_slice(&bytes[..n]);
    i64::from_be_bytes(first)
}

/// The day of `at`, counted from the Unix epoch.
pub fn day_of(at: Timestamp) -> u32 {
    u32::try_from(at.as_millis() / DAY_MS).unwrap_or(u32::MAX)
}

/// The first day a memory of `memory` still keeps at `now`; the days
/// before it are dropped whole.
pub fn first_kept_day(now: Timestamp, memory: Duration) -> u32 {
    day_of(now.saturating_sub(memory))
}

/// The answer to a claim that would start a key afresh, if it is a late
/// retry: `expired` is the record the store still holds for the key (if
/// any, expired), `remembered` what its memory holds. `None` means the
/// claim acquires as usual.
///
/// Both are weighed: a key reused by another request whose record has
/// expired in turn still refuses the first request's late retry while the
/// memory holds it. The memory keeps one entry a key (the latest request
/// under it). Keys of [`remembered_scope`]s only.
pub fn late_retry(
    id: &RecordId,
    expired: Option<&Record>,
    remembered: Option<&Forgotten>,
    params: &ClaimParams,
    now: Timestamp,
    memory: Duration,
) -> Option<ClaimOutcome> {
    if !remembered_scope(id.scope().as_str()) {
        return None;
    }
    let first_day = first_kept_day(now, memory);
    let wanted = fingerprint_prefix(params.fingerprint.as_ref());
    let held = expired
        .filter(|r| r.is_expired(now))
        .and_then(|r| Some((ended(r)?, r.expires_at)));
    let remembered = remembered.map(|entry| (entry.fingerprint, entry.expired_at()));
    [held, remembered]
        .into_iter()
        .flatten()
        .find(|(fingerprint, expired_at)| {
            *fingerprint == wanted && day_of(*expired_at) >= first_day
        })
        .map(|(_, expired_at)| ClaimOutcome::Forgotten { expired_at })
}

/// Whether keys of `scope` are remembered: every scope but the outbox's
/// own bookkeeping (`idem.outbox` and `idem.outbox/…`), whose records are
/// claimed again by design.
pub fn remembered_scope(scope: &str) -> bool {
    scope != crate::outbox::REGISTRY_SCOPE && !scope.starts_with(crate::outbox::MARKER_SCOPE_PREFIX)
}

/// The fingerprint to remember of a record that ended (completed or
/// failed); `None` for one that never did.
fn ended(record: &Record) -> Option<FingerprintPrefix> {
    matches!(record.state, State::Completed { .. } | State::Failed { .. })
        .then(|| fingerprint_prefix(record.fingerprint.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Failure;

    const MEMORY: Duration = Duration::from_secs(30 * 86_400);

    fn record(state: State, fingerprint: Option<Fingerprint>, expires_at: Timestamp) -> Record {
        Record {
            state,
            fingerprint,
            attempt: 1,
            fence: 1,
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(0),
            expires_at,
        }
    }

    fn params(fingerprint: Option<Fingerprint>) -> ClaimParams {
        ClaimParams {
            fingerprint,
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(3600),
        }
    }

    #[test]
    fn a_late_retry_is_told_from_a_new_request_under_an_old_key() {
        let id = RecordId::parse("s", "k").expect("a valid id");
        let a = Some(Fingerprint::of_bytes(b"a"));
        let b = Some(Fingerprint::of_bytes(b"b"));
        let expiry = Timestamp::from_millis(10 * DAY_MS + 5);
        let now = expiry.saturating_add(Duration::from_secs(86_400 * 3));
        let done = record(
            State::Completed {
                response: "r".into(),
            },
            a,
            expiry,
        );
        assert_eq!(
            late_retry(&id, Some(&done), None, &params(a), now, MEMORY),
            Some(ClaimOutcome::Forgotten { expired_at: expiry })
        );
        assert_eq!(
            late_retry(&id, Some(&done), None, &params(b), now, MEMORY),
            None
        );
        let entry = Forgotten::of(&id, &done).expect("a completed record is remembered");
        assert_eq!(
            late_retry(&id, None, Some(&entry), &params(a), now, MEMORY),
            Some(ClaimOutcome::Forgotten {
                expired_at: Timestamp::from_millis(10 * DAY_MS)
            })
        );
        assert_eq!(
            late_retry(&id, None, Some(&entry), &params(b), now, MEMORY),
            None
        );
    }

    #[test]
    fn only_ended_records_within_the_memory_are_remembered() {
        let id = RecordId::parse("s", "k").expect("a valid id");
        let expiry = Timestamp::from_millis(10 * DAY_MS);
        let failed = record(
            State::Failed {
                failure: Failure::new(crate::FailureClass::Terminal, "no"),
            },
            None,
            expiry,
        );
        let released = record(State::Released { last_failure: None }, None, expiry);
        let soon = expiry.saturating_add(Duration::from_secs(60));
        assert!(late_retry(&id, Some(&failed), None, &params(None), soon, MEMORY).is_some());
        assert_eq!(
            late_retry(&id, Some(&released), None, &params(None), soon, MEMORY),
            None
        );
        let beyond = expiry.saturating_add(MEMORY + Duration::from_secs(86_400));
        assert_eq!(
            late_retry(&id, Some(&failed), None, &params(None), beyond, MEMORY),
            None
        );
        let live = expiry.saturating_sub(Duration::from_secs(1));
        assert_eq!(
            late_retry(&id, Some(&failed), None, &params(None), live, MEMORY),
            None
        );
    }

    #[test]
    fn a_reused_key_that_expired_in_turn_still_refuses_the_first_requests_retry() {
        let id = RecordId::parse("s", "k").expect("a valid id");
        let (a, b) = (
            Some(Fingerprint::of_bytes(b"a")),
            Some(Fingerprint::of_bytes(b"b")),
        );
        let first = record(
            State::Completed {
                response: "1".into(),
            },
            a,
            Timestamp::from_millis(DAY_MS),
        );
        let entry = Forgotten::of(&id, &first).expect("remembered");
        let reuse_expiry = Timestamp::from_millis(3 * DAY_MS);
        let reuse = record(
            State::Completed {
                response: "2".into(),
            },
            b,
            reuse_expiry,
        );
        let now = reuse_expiry.saturating_add(Duration::from_secs(60));
        assert!(late_retry(&id, Some(&reuse), Some(&entry), &params(a), now, MEMORY).is_some());
        assert!(late_retry(&id, Some(&reuse), Some(&entry), &params(b), now, MEMORY).is_some());
    }

    #[test]
    fn the_outboxs_own_records_are_never_remembered() {
        let done = record(
            State::Completed {
                response: "r".into(),
            },
            None,
            Timestamp::from_millis(DAY_MS),
        );
        for scope in ["idem.outbox", "idem.outbox/00ff"] {
            let id = RecordId::parse(scope, "k").expect("a valid id");
            assert_eq!(Forgotten::of(&id, &done), None);
            let later = Timestamp::from_millis(2 * DAY_MS);
            assert_eq!(
                late_retry(&id, Some(&done), None, &params(None), later, MEMORY),
                None
            );
        }
    }
}
