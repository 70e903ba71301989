//! Identity of a record: [`Key`], [`Scope`] and the pair of both, [`RecordId`].
//!
//! Keys are what clients and producers send; they are validated against
//! [`KeyRules`] and rejected with a [`KeyError`] that names the rule broken.
//! Nothing is ever truncated or rewritten to make a key fit.
//!
//! Producers mint keys with [`new_v7`]: a UUIDv7 carries the time it was
//! minted, so the receiver can tell a key older than its retention
//! ([`uuid_v7_age`](crate::derive::uuid_v7_age)) from a new one.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;

/// The default maximum key length in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 255;
/// The maximum scope length in bytes.
pub const MAX_SCOPE_LEN: usize = 512;

/// Why a key or scope was rejected. Each variant names the rule broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The value was empty; keys and scopes need at least one byte.
    #[error("{what} is empty (rule: at least 1 byte)")]
    Empty {
        /// `"key"` or `"scope"`.
        what: &'static str,
    },
    /// The value was longer than the configured limit.
    #[error("{what} is {len} bytes long (rule: at most {max} bytes)")]
    TooLong {
        /// `"key"` or `"scope"`.
        what: &'static str,
        /// The length that was given.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// The value held a byte outside the allowed range.
    #[error("{what} has byte 0x{byte:02x} at offset {index} (rule: {rule})")]
    InvalidByte {
        /// `"key"` or `"scope"`.
        what: &'static str,
        /// The offending byte.
        byte: u8,
        /// Its offset in the value.
        index: usize,
        /// The character rule, e.g. "visible ASCII 0x21..=0x7E".
        rule: &'static str,
    },
    /// A part of a composite key was empty or held the separator.
    #[error("composite key part {index} {problem}")]
    InvalidPart {
        /// The position of the part.
        index: usize,
        /// What was wrong with it.
        problem: &'static str,
    },
}

/// Validation rules for keys. The default accepts 1..=255 bytes of visible
/// ASCII (0x21..=0x7E), the rule of the [contract](crate::contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRules {
    max_len: NonZeroUsize,
}

impl Default for KeyRules {
    fn default() -> Self {
        Self {
            max_len: NonZeroUsize::new(DEFAULT_MAX_KEY_LEN).expect("255 is not zero"),
        }
    }
}

impl KeyRules {
    /// Rules with a different maximum length (in bytes).
    pub fn max_len(mut self, max_len: NonZeroUsize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The maximum key length in bytes.
    pub fn max_key_len(&self) -> usize {
        self.max_len.get()
    }

    /// Validates `raw` and returns it as a [`Key`].
    pub fn parse(&self, raw: &str) -> Result<Key, KeyError> {
        check(raw, "key", self.max_len.get(), is_visible, VISIBLE_RULE)?;
        Ok(Key(raw.into()))
    }
}

const VISIBLE_RULE: &str = "visible ASCII 0x21..=0x7E";
const PRINTABLE_RULE: &str = "printable ASCII 0x20..=0x7E";

fn is_visible(b: u8) -> bool {
    (0x21..=0x7E).contains(&b)
}

fn is_printable(b: u8) -> bool {
    (0x20..=0x7E).contains(&b)
}

fn check(
    raw: &str,
    what: &'static str,
    max: usize,
    allowed: fn(u8) -> bool,
    rule: &'static str,
) -> Result<(), KeyError> {
    if raw.is_empty() {
        return Err(KeyError::Empty { what });
    }
    if raw.len() > max {
        return Err(KeyError::TooLong {
            what,
            len: raw.len(),
            max,
        });
    }
    if let Some((index, &byte)) = raw
        .as_bytes()
        .iter()
        .enumerate()
        .find(|(_, b)| !allowed(**b))
    {
        return Err(KeyError::InvalidByte {
            what,
            byte,
            index,
            rule,
        });
    }
    Ok(())
}

/// A validated idempotency key: what a client or producer sends to say
/// "these deliveries are the same operation".
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

impl Key {
    /// Parses a key under the default [`KeyRules`].
    pub fn new(raw: &str) -> Result<Self, KeyError> {
        KeyRules::default().parse(raw)
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", &*self.0)
    }
}

/// A namespace for keys: a consumer group, an HTTP method and route
/// template, a tenant. The same key in two scopes is two records.
///
/// Scopes are 1..=512 bytes of printable ASCII (spaces allowed, so
/// `"POST /orders/{id}"` is a valid scope). Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(Arc<str>);

impl Scope {
    /// Validates and builds a scope.
    pub fn new(raw: &str) -> Result<Self, KeyError> {
        check(raw, "scope", MAX_SCOPE_LEN, is_printable, PRINTABLE_RULE)?;
        Ok(Self(raw.into()))
    }

    /// The scope as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?})", &*self.0)
    }
}

/// The identity of a record: `(scope, key)`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct RecordId {
    scope: Scope,
    key: Key,
}

impl RecordId {
    /// Pairs a scope with a key.
    pub fn new(scope: Scope, key: Key) -> Self {
        Self { scope, key }
    }

    /// Validates both parts with the default rules.
    pub fn parse(scope: &str, key: &str) -> Result<Self, KeyError> {
        Ok(Self::new(Scope::new(scope)?, Key::new(key)?))
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// A short, stable, non-reversible digest of this id for logs, so keys
    /// (which may carry business data) are not written to logs verbatim.
    pub fn log_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.scope.as_str().as_bytes());
        h.update([0u8]);
        h.update(self.key.as_str().as_bytes());
        hex::encode(&h.finalize()[..8])
    }

    /// The key as logs write it: the key itself when `plain` (an
    /// executor built with `log_keys`), else [`log_hash`](Self::log_hash),
    /// worked out only when written.
    pub(crate) fn logged(&self, plain: bool) -> LoggedKey<'_> {
        LoggedKey { id: self, plain }
    }
}

/// A record's key as logs show it (see [`RecordId::logged`]).
#[derive(Clone, Copy)]
pub(crate) struct LoggedKey<'a> {
    id: &'a RecordId,
    plain: bool,
}

impl LoggedKey<'_> {
    /// The record's scope.
    pub(crate) fn scope(&self) -> &Scope {
        self.id.scope()
    }
}

impl fmt::Display for LoggedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.plain {
            fmt::Display::fmt(&self.id.key, f)
        } else {
            f.write_str(&self.id.log_hash())
        }
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.scope, self.key)
    }
}

/// A new key for a producer to stamp on what it sends: a UUIDv7 (RFC
/// 9562) in its usual 36-character text, its first 48 bits the Unix time
/// in milliseconds and 74 random bits after the version and variant.
/// Mint it once per operation and send it with every retry of that
/// operation (as the `Idempotency-Key` header, a broker's message id or
/// header): a key minted per attempt defeats deduplication.
///
/// ```
/// let key = idem::key::new_v7();
/// assert_eq!(key.as_str().len(), 36);
/// assert_eq!(&key.as_str()[14..15], "7");
/// assert_ne!(key, idem::key::new_v7());
/// ```
pub fn new_v7() -> Key {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let random: [u8; 10] = rand::random();
    let uuid = uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid();
    Key(uuid.hyphenated().to_string().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_keys_are_valid_dated_and_distinct() {
        let key = new_v7();
        assert!(Key::new(key.as_str()).is_ok());
        let now = crate::Timestamp::now();
        let age = crate::derive::uuid_v7_age(
            key.as_str(),
            now,
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(5),
        )
        .expect("a UUIDv7");
        assert!(
            matches!(age, crate::derive::KeyAge::Fresh { .. }),
            "{age:?}"
        );
        let many: std::collections::HashSet<Key> = (0..1000).map(|_| new_v7()).collect();
        assert_eq!(many.len(), 1000);
    }

    #[test]
    fn accepts_visible_ascii_up_to_the_limit() {
        assert!(Key::new("a").is_ok());
        assert!(Key::new(&"x".repeat(255)).is_ok());
        assert!(Key::new("order-123:charge:v1").is_ok());
        assert!(Key::new("!~").is_ok());
    }

    #[test]
    fn rejects_with_the_rule_broken() {
        assert_eq!(Key::new(""), Err(KeyError::Empty { what: "key" }));
        assert_eq!(
            Key::new(&"x".repeat(256)),
            Err(KeyError::TooLong {
                what: "key",
                len: 256,
                max: 255
            })
        );
        let err = Key::new("ab c").expect_err("space is not visible ASCII");
        assert_eq!(
            err,
            KeyError::InvalidByte {
                what: "key",
                byte: b' ',
                index: 2,
                rule: VISIBLE_RULE
            }
        );
        assert!(err.to_string().contains("0x20 at offset 2"));
        assert!(matches!(
            Key::new("a\u{7f}"),
            Err(KeyError::InvalidByte { byte: 0x7f, .. })
        ));
        assert!(matches!(
            Key::new("é"),
            Err(KeyError::InvalidByte { byte: 0xc3, .. })
        ));
        assert!(matches!(
            Key::new("a\nb"),
            Err(KeyError::InvalidByte { byte: b'\n', .. })
        ));
    }

    #[test]
    fn limits_are_configurable_never_truncated() {
        let rules = KeyRules::default().max_len(NonZeroUsize::new(4).expect("non-zero"));
        assert!(rules.parse("abcd").is_ok());
        assert!(matches!(
            rules.parse("abcde"),
            Err(KeyError::TooLong { len: 5, max: 4, .. })
        ));
        let long = KeyRules::default().max_len(NonZeroUsize::new(1024).expect("non-zero"));
        assert_eq!(
            long.parse(&"k".repeat(1000)).map(|k| k.as_str().len()),
            Ok(1000)
        );
    }

    #[test]
    fn scopes_allow_spaces_but_not_controls() {
        assert!(Scope::new("POST /orders/{id}").is_ok());
        assert!(matches!(
            Scope::new("a\tb"),
            Err(KeyError::InvalidByte { what: "scope", .. })
        ));
        assert!(matches!(
            Scope::new(""),
            Err(KeyError::Empty { what: "scope" })
        ));
    }

    #[test]
    fn same_key_in_two_scopes_is_two_ids() {
        let a = RecordId::parse("a", "k").expect("valid");
        let b = RecordId::parse("b", "k").expect("valid");
        assert_ne!(a, b);
        assert_ne!(a.log_hash(), b.log_hash());
        assert_eq!(a.log_hash().len(), 16);
    }
}
