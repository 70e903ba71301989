//! Key derivation helpers: for producers that send no key of
//! their own, or whose key must be built from business identifiers.

pub mod json;

use std::time::Duration;

use crate::clock::{duration_millis, Timestamp};
use crate::fingerprint::{Fingerprint, FingerprintError};
use crate::key::{Key, KeyError};

/// The separator between the parts of a [`composite`] key.
pub const COMPOSITE_SEPARATOR: char = ':';

/// A key from the content of a JSON payload: the hex SHA-256 of its
/// canonical form. Two payloads that differ only in member order or
/// whitespace get the same key.
///
/// ```
/// let a = idem::derive::content_key(br#"{"order":1,"sku":"x"}"#).unwrap();
/// let b = idem::derive::content_key(br#"{ "sku": "x", "order": 1 }"#).unwrap();
/// assert_eq!(a, b);
/// ```
pub fn content_key(json: &[u8]) -> Result<Key, FingerprintError> {
    let hex = Fingerprint::of_json(json)?.to_hex();
    Ok(Key::new(&hex).expect("64 hex digits are a valid key"))
}

/// A key from raw bytes: the hex SHA-256 of the bytes.
pub fn bytes_key(bytes: &[u8]) -> Key {
    Key::new(&Fingerprint::of_bytes(bytes).to_hex()).expect("64 hex digits are a valid key")
}

/// A composite business key such as `order-123:charge:v1`. Each part must
/// be non-empty and must not contain the separator `:` (so two different
/// part lists can never produce the same key); the result must pass the
/// default key rules.
///
/// ```
/// let k = idem::derive::composite(&["order-123", "charge", "v1"]).unwrap();
/// assert_eq!(k.as_str(), "order-123:charge:v1");
/// assert!(idem::derive::composite(&["a:b", "c"]).is_err());
/// ```
pub fn composite<P: AsRef<str>>(parts: &[P]) -> Result<Key, KeyError> {
    let mut out = String::new();
    for (index, part) in parts.iter().enumerate() {
        let part = part.as_ref();
        if part.is_empty() {
            return Err(KeyError::InvalidPart {
                index,
                problem: "is empty",
            });
        }
        if part.contains(COMPOSITE_SEPARATOR) {
            return Err(KeyError::InvalidPart {
                index,
                problem: "contains the separator ':'",
            });
        }
        if index > 0 {
            out.push(COMPOSITE_SEPARATOR);
        }
        out.push_str(part);
    }
    Key::new(&out)
}

/// A time-windowed key: `base@bucket`, where `bucket` numbers the window of
/// length `window` that `at` falls in. Deliveries of the same `base` within
/// one window share a key; the next window starts afresh (e.g. "at most one
/// reminder per customer per day").
///
/// A zero `window` is treated as one millisecond.
pub fn windowed(base: &str, at: Timestamp, window: Duration) -> Result<Key, KeyError> {
    let bucket = at.as_millis() / duration_millis(window).max(1);
    Key::new(&format!("{base}@{bucket}"))
}

/// What a UUIDv7 key's embedded timestamp says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAge {
    /// Younger than the retention window: a record for it would still be
    /// kept, so deduplication applies.
    Fresh {
        /// How old the key is.
        age: Duration,
    },
    /// Older than the retention window: any record for it may already be
    /// purged, so a "new" claim cannot prove it is not a duplicate. Report
    /// it; do not treat it silently as new.
    OlderThanRetention {
        /// How old the key is.
        age: Duration,
        /// The retention window it exceeds.
        retention: Duration,
    },
    /// The key's time is ahead of `now` by more than the allowed skew.
    FromTheFuture {
        /// How far ahead.
        ahead: Duration,
    },
}

/// Why a key is not a UUIDv7.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UuidKeyError {
    /// Not a UUID in any standard text form.
    #[error("key is not a UUID")]
    NotAUuid,
    /// A UUID, but not version 7.
    #[error("key is a version {version} UUID (rule: version 7, which carries its creation time)")]
    WrongVersion {
        /// The version found.
        version: usize,
    },
}

/// Checks a UUIDv7 key's age against the retention window. Keys dated up
/// to `skew` in the future count as fresh (producers' clocks differ).
///
/// ```
/// use idem::derive::{uuid_v7_age, KeyAge};
/// use idem::Timestamp;
/// use std::time::Duration;
///
/// // A UUIDv7 minted at t = 1_767_225_600_000 ms.
/// let key = "019b76da-a800-7000-8000-000000000000";
/// let now = Timestamp::from_millis(1_767_225_600_000 + 3_600_000);
/// let age = uuid_v7_age(key, now, Duration::from_secs(86_400), Duration::from_secs(5)).unwrap();
/// assert_eq!(age, KeyAge::Fresh { age: Duration::from_secs(3600) });
/// ```
pub fn uuid_v7_age(
    key: &str,
    now: Timestamp,
    retention: Duration,
    skew: Duration,
) -> Result<KeyAge, UuidKeyError> {
    let uuid = uuid::Uuid::try_parse(key).map_err(|_| UuidKeyError::NotAUuid)?;
    let version = uuid.get_version_num();
    if version != 7 {
        return Err(UuidKeyError::WrongVersion { version });
    }
    let b = uuid.as_bytes();
    let minted = b[..6]
        .iter()
        .fold(0u64, |acc, byte| (acc << 8) | u64::from(*byte));
    let minted = Timestamp::from_millis(minted);
    if minted > now {
        let ahead = minted.since(now);
        return Ok(if ahead <= skew {
            KeyAge::Fresh {
                age: Duration::ZERO,
            }
        } else {
            KeyAge::FromTheFuture { ahead }
        });
    }
    let age = now.since(minted);
    Ok(if age > retention {
        KeyAge::OlderThanRetention { age, retention }
    } else {
        KeyAge::Fresh { age }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINTED: u64 = 1_767_225_600_000;
    const KEY: &str = "019b76da-a800-7000-8000-000000000000";

    #[test]
    fn composite_rejects_ambiguous_parts() {
        assert!(matches!(
            composite(&["a", ""]),
            Err(KeyError::InvalidPart { index: 1, .. })
        ));
        assert!(matches!(
            composite(&["a", "b c"]),
            Err(KeyError::InvalidByte { byte: b' ', .. })
        ));
        assert!(matches!(
            composite::<&str>(&[]),
            Err(KeyError::Empty { .. })
        ));
    }

    #[test]
    fn windowed_keys_share_a_window() {
        let day = Duration::from_secs(86_400);
        let t = Timestamp::from_millis(MINTED);
        let same = windowed(
            "remind:42",
            t.saturating_add(Duration::from_secs(3600)),
            day,
        );
        assert_eq!(windowed("remind:42", t, day), same);
        assert_ne!(
            windowed("remind:42", t, day),
            windowed("remind:42", t.saturating_add(day), day)
        );
        assert!(windowed("remind:42", t, Duration::ZERO).is_ok());
    }

    #[test]
    fn uuid_age_is_reported_not_hidden() {
        let keep = Duration::from_secs(86_400);
        let skew = Duration::from_secs(5);
        let at = |ms: u64| Timestamp::from_millis(ms);
        assert!(matches!(
            uuid_v7_age(KEY, at(MINTED + 2 * 86_400_000), keep, skew),
            Ok(KeyAge::OlderThanRetention { .. })
        ));
        assert_eq!(
            uuid_v7_age(KEY, at(MINTED - 1000), keep, skew),
            Ok(KeyAge::Fresh {
                age: Duration::ZERO
            })
        );
        assert_eq!(
            uuid_v7_age(KEY, at(MINTED - 60_000), keep, skew),
            Ok(KeyAge::FromTheFuture {
                ahead: Duration::from_secs(60)
            })
        );
        assert_eq!(
            uuid_v7_age(
                "67e55044-10b1-426f-9247-bb680e5fe0c8",
                at(MINTED),
                keep,
                skew
            ),
            Err(UuidKeyError::WrongVersion { version: 4 })
        );
        assert_eq!(
            uuid_v7_age("nope", at(MINTED), keep, skew),
            Err(UuidKeyError::NotAUuid)
        );
    }

    #[test]
    fn content_keys_are_valid_keys() {
        let k = content_key(b"[1,2]").expect("valid");
        assert_eq!(k.as_str().len(), 64);
        assert_ne!(k, bytes_key(b"[1,2]"));
        assert!(content_key(b"{").is_err());
    }
}
