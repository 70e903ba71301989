//! How results are turned into stored bytes: a [`Codec`] (JSON by
//! default), an envelope that compresses large responses with zstd, and,
//! with a [`Keyring`], encryption at rest ([`AtRest`]).
//!
//! The envelope's first byte names its format:
//!
//! | byte | format | follows |
//! |---|---|---|
//! | `0` | plain | the codec's bytes |
//! | `1` | zstd | the codec's bytes, compressed |
//! | `2` | sealed | the key id's length and id, a nonce, and an envelope of format 0, 1 or 3 encrypted under that key |
//! | `3` | with messages | the run's outgoing messages ([`crate::outbox`]) in front of an envelope of format 0 or 1 |
//!
//! Every stored payload says its layout in its first byte, so a build
//! reads every layout an earlier one wrote: a response's envelope byte
//! (`0` plain, `1` zstd, `2` sealed); a step result's first byte (`2`
//! sealed, anything else the original bare JSON, whose first byte is never
//! below `0x09`).

mod envelope;
mod keyring;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use envelope::{envelope_of, open, plain};
pub use keyring::{Keyring, KeyringError, KEY_BYTES};

use crate::key::RecordId;
use crate::store::BoxError;

/// Serialises handler responses for storage and replay.
pub trait Codec: Send + Sync + 'static {
    /// Encodes a value.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, BoxError>;
    /// Decodes what [`encode`](Self::encode) produced.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// JSON through `serde_json`: readable in the admin tools, and the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// How an executor keeps payloads at rest: responses compressed above a
/// size, and every response and step result sealed when it has a
/// [`Keyring`]. A sealed payload is bound to its record (and step), so
/// one moved to another record does not open.
#[derive(Debug, Clone)]
pub struct AtRest {
    compress_above: usize,
    keyring: Option<Arc<Keyring>>,
}

impl AtRest {
    pub(crate) fn new(compress_above: usize, keyring: Option<Arc<Keyring>>) -> Self {
        Self {
            compress_above,
            keyring,
        }
    }

    /// For reading records outside an executor (admin tools): opens what
    /// `keyring` sealed, and what was stored unsealed.
    pub fn reader(keyring: Option<Keyring>) -> Self {
        Self::new(usize::MAX, keyring.map(Arc::new))
    }

    /// The keyring, if payloads are sealed.
    pub fn keyring(&self) -> Option<&Keyring> {
        self.keyring.as_deref()
    }

    /// A response's stored bytes: the codec's bytes in the envelope,
    /// compressed above the executor's size, sealed under a keyring.
    pub fn seal_response(&self, id: &RecordId, encoded: Vec<u8>) -> Bytes {
        self.seal_run(id, encoded, None)
    }

    /// A run's stored bytes: [`seal_response`](Self::seal_response), with
    /// the run's outgoing messages (as the outbox encodes them) in front of
    /// the response when it sent any, sealed with it.
    pub fn seal_run(&self, id: &RecordId, encoded: Vec<u8>, messages: Option<&[u8]>) -> Bytes {
        let mut inner = envelope::seal(encoded, self.compress_above);
        if let Some(messages) = messages {
            inner = envelope::with_messages(messages, &inner);
        }
        match &self.keyring {
            Some(keyring) => envelope::seal_with(keyring, &inner, &context(id, None)),
            None => inner,
        }
    }

    /// The codec's bytes of the response stored for `id`, inflated to at
    /// most `max_len` bytes.
    pub fn open_response<'a>(
        &self,
        id: &RecordId,
        stored: &'a [u8],
        max_len: usize,
    ) -> Result<Cow<'a, [u8]>, String> {
        if stored.first() != Some(&envelope::SEALED) {
            return envelope::open(stored, max_len);
        }
        let inner = envelope::open_with(self.keyring(), stored, &context(id, None))?;
        envelope::open(&inner, max_len).map(|opened| Cow::Owned(opened.into_owned()))
    }

    /// The outgoing messages stored with `id`'s response (as the outbox
    /// encoded them), or `None` if the run sent none.
    pub fn open_messages<'a>(
        &self,
        id: &RecordId,
        stored: &'a [u8],
    ) -> Result<Option<Cow<'a, [u8]>>, String> {
        if stored.first() != Some(&envelope::SEALED) {
            return Ok(envelope::split_messages(stored)?.map(|(m, _)| Cow::Borrowed(m)));
        }
        let inner = envelope::open_with(self.keyring(), stored, &context(id, None))?;
        Ok(envelope::split_messages(&inner)?.map(|(m, _)| Cow::Owned(m.to_vec())))
    }

    /// A step result's (or a journaled input's) stored bytes: the JSON as
    /// it is, or sealed.
    pub fn seal_step(&self, id: &RecordId, step: &str, json: Bytes) -> Bytes {
        match &self.keyring {
            Some(keyring) => envelope::seal_with(keyring, &json, &context(id, Some(step))),
            None => json,
        }
    }

    /// The JSON of a step result stored for `id`'s step `step`.
    pub fn open_step<'a>(
        &self,
        id: &RecordId,
        step: &str,
        stored: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, String> {
        if stored.first() != Some(&envelope::SEALED) {
            return Ok(Cow::Borrowed(stored));
        }
        envelope::open_with(self.keyring(), stored, &context(id, Some(step))).map(Cow::Owned)
    }
}

/// What a sealed payload is bound to: its record, and its step if any.
fn context(id: &RecordId, step: Option<&str>) -> Vec<u8> {
    let (scope, key) = (id.scope().as_str(), id.key().as_str());
    let mut out = Vec::with_capacity(16 + scope.len() + key.len() + step.map_or(0, str::len));
    out.extend_from_slice(if step.is_some() {
        b"idem/step\0"
    } else {
        b"idem/response\0"
    });
    out.extend_from_slice(scope.as_bytes());
    out.push(0);
    out.extend_from_slice(key.as_bytes());
    if let Some(step) = step {
        out.push(0);
        out.extend_from_slice(step.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str) -> RecordId {
        RecordId::parse("s", key).expect("valid")
    }

    #[test]
    fn sealed_payloads_open_for_their_own_record_and_step_only() {
        let keys = Arc::new(Keyring::new("k1", [3; KEY_BYTES]).expect("key"));
        let at_rest = AtRest::new(16, Some(keys));
        let body = br#"{"token":"sk_live_secret","pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#;
        let stored = at_rest.seal_response(&id("a"), body.to_vec());
        assert_eq!(stored[0], envelope::SEALED);
        assert!(!stored.windows(7).any(|w| w == b"sk_live"));
        let opened = at_rest
            .open_response(&id("a"), &stored, 1 << 20)
            .expect("opens");
        assert_eq!(opened.as_ref(), body);
        assert!(at_rest.open_response(&id("b"), &stored, 1 << 20).is_err());
        let step = at_rest.seal_step(&id("a"), "charge", Bytes::from_static(b"{\"ok\":1}"));
        assert_eq!(
            at_rest
                .open_step(&id("a"), "charge", &step)
                .expect("opens")
                .as_ref(),
            b"{\"ok\":1}"
        );
        assert!(at_rest.open_step(&id("a"), "refund", &step).is_err());
        let keyless = AtRest::new(16, None);
        assert!(keyless
            .open_response(&id("a"), &stored, 1 << 20)
            .expect_err("no keyring")
            .contains("no keyring"));
    }

    #[test]
    fn earlier_layouts_read_with_or_without_a_keyring() {
        let keys = Arc::new(Keyring::new("k1", [3; KEY_BYTES]).expect("key"));
        for at_rest in [AtRest::new(16, None), AtRest::new(16, Some(keys))] {
            let plain = envelope::seal(b"{\"a\":1}".to_vec(), 1024);
            assert_eq!(
                at_rest
                    .open_response(&id("a"), &plain, 100)
                    .expect("plain")
                    .as_ref(),
                b"{\"a\":1}"
            );
            assert_eq!(
                at_rest
                    .open_step(&id("a"), "s", b" {\"a\":1}")
                    .expect("bare")
                    .as_ref(),
                b" {\"a\":1}"
            );
        }
    }
}
