//! The secrets of stored payloads, for the parts of the binary that read
//! and write records outside an executor (`idem serve`, the admin
//! commands): the keyring that seals and opens them, the secret keys are
//! hashed with, and what a stored response is (its envelope, the key that
//! sealed it, and, once opened, what it holds).

use std::borrow::Cow;
use std::path::Path;

use bytes::Bytes;

use idem::codec::{envelope_of, AtRest, Codec, Keyring};
use idem::key_hash::KeyHasher;
use idem::outbox::Message;
use idem::RecordId;
use idem_http::{Binary, Kept, StoredResponse};
use serde_json::{json, Value};

/// The secrets given on the command line (`--keyring`, `--key-secret`);
/// `Default` is none: results stored as sent, keys as given.
#[derive(Debug, Clone)]
pub struct Secrets {
    at_rest: AtRest,
    hasher: Option<KeyHasher>,
}

impl Default for Secrets {
    fn default() -> Self {
        Self {
            at_rest: AtRest::reader(None),
            hasher: None,
        }
    }
}

impl Secrets {
    /// Reads the files given.
    pub fn read(keyring: Option<&Path>, key_secret: Option<&Path>) -> anyhow::Result<Self> {
        let keyring = keyring
            .map(Keyring::from_file)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--keyring: {e}"))?;
        let hasher = key_secret
            .map(KeyHasher::from_file)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--key-secret: {e}"))?;
        Ok(Self {
            at_rest: AtRest::reader(keyring),
            hasher,
        })
    }

    /// `id` as the store knows it: hashed under `--key-secret`.
    pub fn stored_id(&self, id: &RecordId) -> RecordId {
        match &self.hasher {
            Some(hasher) => hasher.hash(id),
            None => id.clone(),
        }
    }

    /// A result's JSON as `idem serve` stores it: sealed under the
    /// keyring, else the JSON as it is (as before keyrings).
    pub fn seal_result(&self, id: &RecordId, json: Bytes) -> Bytes {
        match self.at_rest.keyring() {
            Some(_) => self.at_rest.seal_response(id, json.to_vec()),
            None => json,
        }
    }

    /// A result's JSON and the messages its run sends, as `idem serve`
    /// stores them: [`seal_result`](Self::seal_result) when there are
    /// none; else in the envelope that carries them (sealed under the
    /// keyring), which every outbox dispatcher reads.
    pub fn seal_run(&self, id: &RecordId, json: Bytes, messages: &[Message]) -> Bytes {
        if messages.is_empty() {
            return self.seal_result(id, json);
        }
        let frame = idem::outbox::encode_messages(messages);
        self.at_rest.seal_run(id, json.to_vec(), Some(&frame))
    }

    /// The JSON of a result [`seal_result`](Self::seal_result) or
    /// [`seal_run`](Self::seal_run) stored.
    pub fn open_result<'a>(
        &self,
        id: &RecordId,
        stored: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, String> {
        match envelope_of(stored) {
            ("sealed" | "with-messages", _) => self.at_rest.open_response(id, stored, usize::MAX),
            _ => Ok(Cow::Borrowed(stored)),
        }
    }

    /// How payloads are sealed and opened: step results go through it as
    /// they are.
    pub fn at_rest(&self) -> &AtRest {
        &self.at_rest
    }

    /// A stored HTTP response, opened (sealed ones need `--keyring`).
    pub fn http_response(&self, id: &RecordId, stored: &[u8]) -> Result<StoredResponse, String> {
        let opened = self.at_rest.open_response(id, stored, usize::MAX)?;
        Binary
            .decode::<StoredResponse>(&opened)
            .map_err(|e| format!("not an HTTP response: {e}"))
    }

    /// A stored response, described: its envelope and, when sealed, the
    /// key that sealed it; once opened (sealed ones need `--keyring`), an
    /// HTTP response's status, policy and sizes, or another result's JSON.
    pub fn describe_response(&self, id: &RecordId, stored: &[u8]) -> Value {
        let (format, sealed_with) = envelope_of(stored);
        let mut out = json!({ "envelope": format });
        if let Some(key) = sealed_with {
            out["sealed_with"] = json!(key);
        }
        let opened = match self.at_rest.open_response(id, stored, usize::MAX) {
            Ok(opened) => opened,
            Err(reason) => {
                out["unopened"] = json!(reason);
                return out;
            }
        };
        match idem::outbox::stored_messages(&self.at_rest, id, stored) {
            Ok(messages) if messages.is_empty() => {}
            Ok(messages) => {
                out["messages"] = messages
                    .iter()
                    .map(|m| {
                        json!({
                            "id": m.id(),
                            "destination": m.destination(),
                            "headers": m.headers().len(),
                            "bytes": m.payload().len(),
                        })
                    })
                    .collect();
            }
            Err(reason) => out["messages_unreadable"] = json!(reason),
        }
        if let Ok(value) = serde_json::from_slice::<Value>(&opened) {
            out["value"] = value;
        } else if let Ok(http) = Binary.decode::<StoredResponse>(&opened) {
            out["http"] = json!({
                "status": http.status,
                "kept": http.kept.as_str(),
                "headers": http.headers.len(),
                "body_bytes": http.body.len(),
                "trailers": http.trailers.len(),
            });
            if let Kept::Reference(blob) = &http.kept {
                out["http"]["blob"] = json!({
                    "locator": blob.locator,
                    "digest": blob.digest_hex(),
                    "bytes": blob.len,
                });
            }
        }
        out
    }

    /// A journaled step result as JSON, opened if it was sealed.
    pub fn step_result(&self, id: &RecordId, step: &str, stored: &[u8]) -> Result<Value, String> {
        let opened = self.at_rest.open_step(id, step, stored)?;
        serde_json::from_slice(&opened).map_err(|e| e.to_string())
    }
}
