//! Keys hashed at rest: [`KeyHasher`] turns a record's key into a keyed
//! hash of its scope and key, so a dump of the store does not show the
//! keys clients sent (order numbers, emails, payment references).

use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::key::{Key, RecordId};

/// What a hashed key begins with.
pub const HASHED_KEY_PREFIX: &str = "hk1-";

/// Bytes in a hashing secret.
pub const SECRET_BYTES: usize = 32;

/// A secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key-hashing secret: {0}")]
pub struct KeyHasherError(String);

/// Replaces each record's key by `hk1-` and the hex HMAC-SHA256, under a
/// secret, of its scope and key: the same key in two scopes hashes apart,
/// and without the secret a dump cannot be checked against guessed keys.
/// Scopes stay readable (they name routes and tenants, whose ids the
/// HTTP layer hashes already).
///
/// The secret never rotates: a record is found by its hash, so another
/// secret forgets every key stored under the old one (their retries run
/// again). Keep it with the keyring, not in the store. Its `Debug` shows
/// nothing of it.
#[derive(Clone)]
pub struct KeyHasher {
    mac: Hmac<Sha256>,
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHasher(..)")
    }
}

impl KeyHasher {
    /// A hasher under `secret`.
    pub fn new(secret: [u8; SECRET_BYTES]) -> Self {
        Self {
            mac: Hmac::new_from_slice(&secret).expect("HMAC takes a key of any length"),
        }
    }

    /// Parses a secret of 64 hex digits (surrounding whitespace and `#`
    /// comment lines ignored).
    pub fn parse(text: &str) -> Result<Self, KeyHasherError> {
        let hex_text: String = text
            .lines()
            .map(|line| line.split('#').next().unwrap_or("").trim())
            .collect();
        let mut secret = [0u8; SECRET_BYTES];
        hex::decode_to_slice(&hex_text, &mut secret)
            .map_err(|_| KeyHasherError("must be 64 hex digits (32 bytes)".to_owned()))?;
        Ok(Self::new(secret))
    }

    /// Reads the secret from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyHasherError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| KeyHasherError(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// `id` as stored: its scope, and its key hashed. Every key is
    /// hashed, one that looks hashed too: a client who learnt a stored
    /// hash (from a dump) cannot use it to reach that record.
    pub fn hash(&self, id: &RecordId) -> RecordId {
        let mut mac = self.mac.clone();
        mac.update(id.scope().as_str().as_bytes());
        mac.update(&[0]);
        mac.update(id.key().as_str().as_bytes());
        let digest = mac.finalize().into_bytes();
        let key = Key::new(&format!("{HASHED_KEY_PREFIX}{}", hex::encode(digest)))
            .expect("a prefix and 64 hex digits make a valid key");
        RecordId::new(id.scope().clone(), key)
    }
}

/// Whether `key` is one [`KeyHasher::hash`] made.
pub fn is_hashed(key: &Key) -> bool {
    key.as_str()
        .strip_prefix(HASHED_KEY_PREFIX)
        .is_some_and(|rest| rest.len() == 64 && rest.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(scope: &str, key: &str) -> RecordId {
        RecordId::parse(scope, key).expect("valid")
    }

    #[test]
    fn keys_hash_per_scope_and_secret_and_only_once() {
        let hasher = KeyHasher::new([1; SECRET_BYTES]);
        let a = hasher.hash(&id("pay", "order-7"));
        assert_eq!(a.scope().as_str(), "pay");
        assert!(a.key().as_str().starts_with(HASHED_KEY_PREFIX));
        assert!(!a.key().as_str().contains("order-7"));
        assert_eq!(
            hasher.hash(&id("pay", "order-7")),
            a,
            "the same id, the same hash"
        );
        assert_ne!(
            hasher.hash(&a),
            a,
            "a stored hash sent as a key reaches another record"
        );
        assert!(is_hashed(a.key()) && !is_hashed(&Key::new("order-7").expect("key")));
        assert_ne!(hasher.hash(&id("refund", "order-7")).key(), a.key());
        assert_ne!(
            KeyHasher::new([2; SECRET_BYTES]).hash(&id("pay", "order-7")),
            a
        );
    }

    #[test]
    fn secrets_parse_from_hex_only() {
        let text = format!("# the key-hashing secret\n{}\n", "ab".repeat(32));
        let parsed = KeyHasher::parse(&text).expect("parses");
        assert_eq!(
            parsed.hash(&id("s", "k")),
            KeyHasher::new([0xab; SECRET_BYTES]).hash(&id("s", "k"))
        );
        assert!(KeyHasher::parse("abcd").is_err());
        assert!(KeyHasher::parse(&"zz".repeat(32)).is_err());
        assert_eq!(format!("{parsed:?}"), "KeyHasher(..)");
    }
}
