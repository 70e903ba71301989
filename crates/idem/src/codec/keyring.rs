//! Keys that seal stored payloads (XChaCha20-Poly1305), each under an id
//! kept beside what it sealed, so keys rotate without a flag day: the
//! first key seals, every key opens.

use std::fmt;
use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};

/// Bytes in a key.
pub const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;
const MAX_ID_BYTES: usize = 32;

/// A keyring that cannot be built as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyringError {
    /// A key id is empty, too long or has characters other than ASCII
    /// letters, digits, `.`, `_` and `-`.
    #[error("key id {0:?} must be 1 to 32 ASCII letters, digits, '.', '_' or '-'")]
    BadId(String),
    /// A key is not 64 hex digits (32 bytes).
    #[error("key {id:?} must be 64 hex digits (32 bytes)")]
    BadKey {
        /// The key's id.
        id: String,
    },
    /// Two keys share an id.
    #[error("key id {0:?} appears twice")]
    DuplicateId(String),
    /// A line of a keyring file is not `id:hex`.
    #[error("line {line}: expected `id:64 hex digits`")]
    BadLine {
        /// The line's number, from 1.
        line: usize,
    },
    /// The keyring has no key.
    #[error("the keyring has no key")]
    Empty,
    /// The file or variable could not be read.
    #[error("{0}")]
    Unreadable(String),
}

/// Keys for sealing stored payloads. The first key added seals; every key
/// opens what it sealed. Its `Debug` shows the ids, never the keys.
///
/// The text form, one key a line (`#` starts a comment), newest first:
///
/// ```text
/// 2026-11:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
/// 2026-05:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff
/// ```
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish()
    }
}

impl Keyring {
    /// A keyring sealing with `key` under `id`.
    pub fn new(id: &str, key: [u8; KEY_BYTES]) -> Result<Self, KeyringError> {
        Self { keys: Vec::new() }.with_key(id, key)
    }

    /// Adds an older key: it opens what it sealed, and seals nothing.
    pub fn with_key(mut self, id: &str, key: [u8; KEY_BYTES]) -> Result<Self, KeyringError> {
        check_id(id)?;
        if self.keys.iter().any(|(known, _)| known == id) {
            return Err(KeyringError::DuplicateId(id.to_owned()));
        }
        let cipher = XChaCha20Poly1305::new(Key::from_slice(&key));
        self.keys.push((id.to_owned(), cipher));
        Ok(self)
    }

    /// Parses the text form (see the type's docs).
    pub fn parse(text: &str) -> Result<Self, KeyringError> {
        let mut keys = Self { keys: Vec::new() };
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (id, hex_key) = line
                .split_once(':')
                .ok_or(KeyringError::BadLine { line: n + 1 })?;
            let (id, hex_key) = (id.trim(), hex_key.trim());
            let mut key = [0u8; KEY_BYTES];
            hex::decode_to_slice(hex_key, &mut key)
                .map_err(|_| KeyringError::BadKey { id: id.to_owned() })?;
            keys = keys.with_key(id, key)?;
        }
        if keys.keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        Ok(keys)
    }

    /// Reads the text form from a file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyringError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| KeyringError::Unreadable(format!("{}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// Reads the text form from an environment variable (lines may also
    /// be separated by `,`).
    pub fn from_env(var: &str) -> Result<Self, KeyringError> {
        let text =
            std::env::var(var).map_err(|e| KeyringError::Unreadable(format!("${var}: {e}")))?;
        Self::parse(&text.replace(',', "\n"))
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> &str {
        self.keys.first().map_or("", |(id, _)| id)
    }

    /// The ids of every key, the sealing one first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(id, _)| id.as_str())
    }

    /// Seals `plain`, bound to `context` (a sealed payload opens only
    /// under the context it was sealed for): the key id's length and the
    /// id, a random nonce, then the ciphertext and its tag.
    pub(crate) fn seal(&self, plain: &[u8], context: &[u8], out: &mut Vec<u8>) {
        let (id, cipher) = self.keys.first().expect("a keyring holds a key");
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let sealed = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: context,
                },
            )
            .expect("XChaCha20-Poly1305 seals any payload idem stores");
        out.reserve(1 + id.len() + NONCE_BYTES + sealed.len());
        out.push(u8::try_from(id.len()).expect("ids are at most 32 bytes"));
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
    }

    /// Opens what [`seal`](Self::seal) wrote for `context`.
    pub(crate) fn open(&self, sealed: &[u8], context: &[u8]) -> Result<Vec<u8>, String> {
        let (id, rest) = split_id(sealed)?;
        let cipher = self
            .keys
            .iter()
            .find(|(known, _)| known == id)
            .map(|(_, cipher)| cipher)
            .ok_or_else(|| format!("sealed with key {id:?}, which the keyring does not hold"))?;
        if rest.len() < NONCE_BYTES {
            return Err("sealed payload is cut short".to_owned());
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_BYTES);
        cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: context,
                },
            )
            .map_err(|_| {
                format!("sealed payload does not open with key {id:?}: altered, or moved from another record")
            })
    }
}

/// The key id a sealed payload names, and what follows it.
pub(crate) fn split_id(sealed: &[u8]) -> Result<(&str, &[u8]), String> {
    let (&len, rest) = sealed
        .split_first()
        .ok_or_else(|| "sealed payload is empty".to_owned())?;
    let len = usize::from(len);
    if rest.len() < len {
        return Err("sealed payload is cut short".to_owned());
    }
    let (id, rest) = rest.split_at(len);
    let id =
        std::str::from_utf8(id).map_err(|_| "sealed payload's key id is not text".to_owned())?;
    Ok((id, rest))
}

fn check_id(id: &str) -> Result<(), KeyringError> {
    let fine = !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fine {
        Ok(())
    } else {
        Err(KeyringError::BadId(id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = Keyring::parse(&format!("old:{A}")).expect("parses");
        let mut sealed = Vec::new();
        old.seal(b"secret", b"ctx", &mut sealed);
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        let rotated =
            Keyring::parse(&format!("# newest first\nnew:{B}\nold:{A}\n")).expect("parses");
        assert_eq!(rotated.current_id(), "new");
        assert_eq!(
            rotated.open(&sealed, b"ctx").expect("old key opens"),
            b"secret"
        );
        let mut again = Vec::new();
        rotated.seal(b"secret", b"ctx", &mut again);
        assert_eq!(split_id(&again).expect("id").0, "new");
        assert!(old
            .open(&again, b"ctx")
            .expect_err("no new key")
            .contains("\"new\""));
    }

    #[test]
    fn a_payload_opens_only_in_its_own_context_and_unaltered() {
        let keys = Keyring::new("k", [7; KEY_BYTES]).expect("key");
        let mut sealed = Vec::new();
        keys.seal(b"{\"card\":\"4242\"}", b"response\0s\0k1", &mut sealed);
        assert!(keys.open(&sealed, b"response\0s\0k2").is_err());
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        assert!(keys.open(&sealed, b"response\0s\0k1").is_err());
        assert!(keys.open(&sealed[..10], b"response\0s\0k1").is_err());
    }

    #[test]
    fn bad_keyrings_are_refused_by_name() {
        assert_eq!(
            Keyring::parse("# nothing\n").expect_err("refused"),
            KeyringError::Empty
        );
        assert_eq!(
            Keyring::parse("k:abcd").expect_err("refused"),
            KeyringError::BadKey { id: "k".into() }
        );
        assert_eq!(
            Keyring::parse(&format!("k:{A}\nk:{B}")).expect_err("refused"),
            KeyringError::DuplicateId("k".into())
        );
        assert_eq!(
            Keyring::parse("no colon").expect_err("refused"),
            KeyringError::BadLine { line: 1 }
        );
        assert!(matches!(
            Keyring::parse(&format!("bad id:{A}")).expect_err("refused"),
            KeyringError::BadId(_)
        ));
        let debug = format!("{:?}", Keyring::parse(&format!("k:{A}")).expect("ok"));
        assert!(
            debug.contains("\"k\"") && !debug.contains("0011"),
            "{debug}"
        );
    }
}
