//! Where a delivery's idempotency key comes from.

use idem::derive::json::{self, JsonDoc, JsonKey, JsonKeyError};
use idem::{derive, Key, KeyError, KeyRules};

use crate::Message;

/// One place a key can be read from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// A message header, e.g. `Idempotency-Key` or `Nats-Msg-Id`.
    Header(String),
    /// The broker's own message id: AMQP `message-id`, JetStream
    /// `Nats-Msg-Id`, Kafka `topic/partition/offset`.
    MessageId,
    /// A string or integer in the JSON payload, by JSON pointer
    /// (RFC 6901), e.g. `/order/id`.
    JsonPointer(String),
    /// Several JSON pointers joined with `:` in order, e.g. an order id and
    /// a step name: `["/order_id", "/step"]`.
    Composite(Vec<String>),
    /// The hex SHA-256 of the canonical JSON of chosen fields of the
    /// payload, e.g. `["/account", "/amount", "/day"]`: a key from a
    /// message's immutable fields when it carries no id. Absent when none
    /// of the fields is there.
    Fields(Vec<String>),
    /// The hex SHA-256 of the payload's canonical JSON (member order and
    /// whitespace do not matter), or of its bytes when it is not JSON.
    ContentHash,
}

impl From<JsonKey> for KeySource {
    fn from(source: JsonKey) -> Self {
        match source {
            JsonKey::Pointer(pointer) => Self::JsonPointer(pointer),
            JsonKey::Composite(pointers) => Self::Composite(pointers),
            JsonKey::Fields(fields) => Self::Fields(fields),
        }
    }
}

/// What to do with a delivery none of the sources gives a key for. There
/// is deliberately no "process it unguarded" choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Dead-letter it, with a reason naming the sources tried (default).
    #[default]
    DeadLetter,
    /// Key it by its content hash, as [`KeySource::ContentHash`]: two
    /// deliveries with the same content are then one message.
    ContentHash,
}

/// Why no usable key was found. The delivery is dead-lettered with this
/// as its reason; it is bad input, and retrying cannot fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyProblem {
    /// None of the sources was present.
    #[error("no idempotency key: {tried} absent")]
    Missing {
        /// The sources tried, e.g. `header "Idempotency-Key", message id`.
        tried: String,
    },
    /// A source was present, but its value breaks the key rules.
    #[error("idempotency key from {source_name} is invalid: {error}")]
    Invalid {
        /// Where the value came from.
        source_name: String,
        /// The rule it broke.
        error: KeyError,
    },
    /// A JSON source was configured but the payload is not JSON.
    #[error("payload is not JSON, so {source_name} cannot be read: {reason}")]
    NotJson {
        /// The source that needed JSON.
        source_name: String,
        /// The parser's complaint.
        reason: String,
    },
    /// The key is a UUIDv7 minted longer ago than the retention (see
    /// [`KeyExtractor::reject_old_uuid_v7`]): its record may have expired
    /// already, so a redelivery this late cannot be told from a new
    /// message.
    #[error(
        "idempotency key is a UUIDv7 minted {}s ago, longer than records are kept ({}s): a \
         delivery this late may be a duplicate whose record has expired, so it is not run",
        age.as_secs(),
        retention.as_secs()
    )]
    TooOld {
        /// The key's age, by the time in it.
        age: std::time::Duration,
        /// The retention it exceeds.
        retention: std::time::Duration,
    },
    /// A JSON source is unusable: a pointer that does not start with `/`,
    /// or a list naming no field.
    #[error("{0}")]
    Unusable(String),
    /// A JSON pointer pointed at something other than a string or integer.
    #[error("{source_name} is {found}, not a string or an integer")]
    WrongType {
        /// The pointer.
        source_name: String,
        /// What was found there, e.g. `an object`.
        found: &'static str,
    },
}

/// Reads the key of a delivery: the first source present wins; an absent
/// key is handled as [`MissingKey`] says; a present but invalid key is
/// never replaced by another source.
///
/// ```
/// use idem_consumer::{KeyExtractor, KeySource, MissingKey};
///
/// let keys = KeyExtractor::header("Idempotency-Key")
///     .or(KeySource::JsonPointer("/order_id".into()))
///     .on_missing(MissingKey::DeadLetter);
/// # let _ = keys;
/// ```
#[derive(Debug, Clone)]
pub struct KeyExtractor {
    sources: Vec<KeySource>,
    missing: MissingKey,
    rules: KeyRules,
    max_uuid_age: Option<std::time::Duration>,
}

impl KeyExtractor {
    /// Keys from `source`.
    pub fn new(source: KeySource) -> Self {
        Self {
            sources: vec![source],
            missing: MissingKey::default(),
            rules: KeyRules::default(),
            max_uuid_age: None,
        }
    }

    /// The sources, in the order they are tried.
    pub fn sources(&self) -> &[KeySource] {
        &self.sources
    }

    /// Keys from the header `name`.
    pub fn header(name: impl Into<String>) -> Self {
        Self::new(KeySource::Header(name.into()))
    }

    /// Keys from the broker's message id.
    pub fn message_id() -> Self {
        Self::new(KeySource::MessageId)
    }

    /// Keys from a JSON pointer into the payload.
    pub fn json_pointer(pointer: impl Into<String>) -> Self {
        Self::new(KeySource::JsonPointer(pointer.into()))
    }

    /// Keys from several JSON pointers joined with `:`.
    pub fn composite<P: Into<String>>(pointers: impl IntoIterator<Item = P>) -> Self {
        Self::new(KeySource::Composite(
            pointers.into_iter().map(Into::into).collect(),
        ))
    }

    /// Keys from the content hash of the payload.
    pub fn content_hash() -> Self {
        Self::new(KeySource::ContentHash)
    }

    /// Tries `source` when the earlier ones are absent.
    #[must_use]
    pub fn or(mut self, source: KeySource) -> Self {
        self.sources.push(source);
        self
    }

    /// What to do when no source is present (default: dead-letter).
    #[must_use]
    pub fn on_missing(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }

    /// The key rules (default: 1..=255 bytes of visible ASCII).
    #[must_use]
    pub fn rules(mut self, rules: KeyRules) -> Self {
        self.rules = rules;
        self
    }

    /// Dead-letter deliveries whose key is a UUIDv7 minted longer ago
    /// than `retention` (pass the executor's retention): their record may
    /// already have expired, so running them could run a message twice.
    /// Keys that are not UUIDv7s are not affected; the age is read against
    /// this machine's clock, with 5 s of slack for keys from the future.
    #[must_use]
    pub fn reject_old_uuid_v7(mut self, retention: std::time::Duration) -> Self {
        self.max_uuid_age = Some(retention);
        self
    }

    /// The key of `message`, or why it has none. The payload is parsed as
    /// JSON at most once, and only when a source needs it.
    pub fn extract<M: Message + ?Sized>(&self, message: &M) -> Result<Key, KeyProblem> {
        self.extract_from(message).map(|(key, _)| key)
    }

    /// [`extract`](Self::extract), with the source the key was read from
    /// (`None` for a content hash taken because no source was present).
    pub(crate) fn extract_from<M: Message + ?Sized>(
        &self,
        message: &M,
    ) -> Result<(Key, Option<&KeySource>), KeyProblem> {
        let mut json = JsonDoc::new(message.payload());
        for source in &self.sources {
            if let Some(key) = self.read(source, message, &mut json)? {
                return Ok((self.check_age(key)?, Some(source)));
            }
        }
        match self.missing {
            MissingKey::ContentHash => Ok((content_hash(message.payload()), None)),
            MissingKey::DeadLetter => Err(KeyProblem::Missing {
                tried: self
                    .sources
                    .iter()
                    .map(describe)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    fn check_age(&self, key: Key) -> Result<Key, KeyProblem> {
        let Some(retention) = self.max_uuid_age else {
            return Ok(key);
        };
        let skew = std::time::Duration::from_secs(5);
        match derive::uuid_v7_age(key.as_str(), idem::Timestamp::now(), retention, skew) {
            Ok(derive::KeyAge::OlderThanRetention { age, retention }) => {
                Err(KeyProblem::TooOld { age, retention })
            }
            _ => Ok(key),
        }
    }

    fn read<M: Message + ?Sized>(
        &self,
        source: &KeySource,
        message: &M,
        json: &mut JsonDoc<'_>,
    ) -> Result<Option<Key>, KeyProblem> {
        let raw = match source {
            KeySource::Header(name) => message.header(name),
            KeySource::MessageId => message.message_id(),
            KeySource::JsonPointer(pointer) => {
                return json::pointer_key(json, pointer, &self.rules).map_err(from_json)
            }
            KeySource::Composite(pointers) => {
                return json::composite_key(json, pointers, &self.rules).map_err(from_json)
            }
            KeySource::Fields(fields) => return json::fields_key(json, fields).map_err(from_json),
            KeySource::ContentHash => return Ok(Some(content_hash(message.payload()))),
        };
        raw.map(|raw| {
            self.rules.parse(raw).map_err(|error| KeyProblem::Invalid {
                source_name: describe(source),
                error,
            })
        })
        .transpose()
    }
}

/// A JSON source's problem, as the consumer reports it.
fn from_json(error: JsonKeyError) -> KeyProblem {
    match error {
        JsonKeyError::NotJson {
            source_name,
            reason,
        } => KeyProblem::NotJson {
            source_name,
            reason,
        },
        JsonKeyError::WrongType { source_name, found } => {
            KeyProblem::WrongType { source_name, found }
        }
        JsonKeyError::Invalid { source_name, error } => KeyProblem::Invalid { source_name, error },
        other => KeyProblem::Unusable(other.to_string()),
    }
}

fn content_hash(payload: &[u8]) -> Key {
    derive::content_key(payload).unwrap_or_else(|_| derive::bytes_key(payload))
}

fn describe(source: &KeySource) -> String {
    match source {
        KeySource::Header(name) => format!("header {name:?}"),
        KeySource::MessageId => "message id".to_owned(),
        KeySource::JsonPointer(pointer) => format!("JSON pointer {pointer:?}"),
        KeySource::Composite(pointers) => format!("composite {pointers:?}"),
        KeySource::Fields(fields) => format!("hash of fields {fields:?}"),
        KeySource::ContentHash => "content hash".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OwnedMessage;

    fn msg(payload: &str) -> OwnedMessage {
        OwnedMessage::new(payload.to_owned())
    }

    #[test]
    fn first_present_source_wins_and_absent_ones_fall_through() {
        let keys = KeyExtractor::header("Idempotency-Key").or(KeySource::JsonPointer("/id".into()));
        let with_header = msg(r#"{"id": "from-body"}"#).with_header("Idempotency-Key", "from-h");
        assert_eq!(
            keys.extract(&with_header).expect("valid").as_str(),
            "from-h"
        );
        assert_eq!(
            keys.extract(&msg(r#"{"id": "from-body"}"#))
                .expect("valid")
                .as_str(),
            "from-body"
        );
        assert_eq!(
            keys.extract(&msg(r#"{"id": 42}"#)).expect("valid").as_str(),
            "42"
        );
    }

    #[test]
    fn a_missing_key_is_dead_lettered_or_hashed_never_skipped() {
        let keys = KeyExtractor::header("Idempotency-Key").or(KeySource::MessageId);
        let problem = keys.extract(&msg("{}")).expect_err("refused");
        assert_eq!(
            problem.to_string(),
            "no idempotency key: header \"Idempotency-Key\", message id absent"
        );
        let hashed = keys.on_missing(MissingKey::ContentHash);
        let a = hashed.extract(&msg(r#"{"a":1,"b":2}"#)).expect("valid");
        let b = hashed
            .extract(&msg(r#"{ "b": 2, "a": 1 }"#))
            .expect("valid");
        assert_eq!(a, b, "canonical JSON: order and whitespace do not matter");
        let c = hashed.extract(&msg(r#"{"a":1,"b":3}"#)).expect("valid");
        assert_ne!(a, c);
        let raw = hashed.extract(&msg("not json")).expect("valid");
        assert_eq!(raw, derive::bytes_key(b"not json"));
    }

    #[test]
    fn a_present_but_invalid_key_is_refused_not_replaced() {
        let keys = KeyExtractor::header("k").or(KeySource::ContentHash);
        let bad = msg("{}").with_header("k", "has space");
        match keys.extract(&bad) {
            Err(KeyProblem::Invalid { source_name, .. }) => {
                assert_eq!(source_name, "header \"k\"");
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
        let long = msg("{}").with_header("k", &"x".repeat(300));
        assert!(matches!(
            keys.extract(&long),
            Err(KeyProblem::Invalid {
                error: KeyError::TooLong { len: 300, .. },
                ..
            })
        ));
    }

    #[test]
    fn json_sources_report_broken_json_and_wrong_types() {
        let keys = KeyExtractor::json_pointer("/id");
        assert!(matches!(
            keys.extract(&msg("{broken")),
            Err(KeyProblem::NotJson { .. })
        ));
        for (payload, found) in [
            (r#"{"id": {"x": 1}}"#, "an object"),
            (r#"{"id": [1]}"#, "an array"),
            (r#"{"id": true}"#, "a boolean"),
            (r#"{"id": 1.5}"#, "a fractional number"),
        ] {
            match keys.extract(&msg(payload)) {
                Err(KeyProblem::WrongType { found: f, .. }) => assert_eq!(f, found),
                other => panic!("{payload}: expected WrongType, got {other:?}"),
            }
        }
        assert!(matches!(
            keys.extract(&msg(r#"{"id": null}"#)),
            Err(KeyProblem::Missing { .. })
        ));
    }

    #[test]
    fn composite_keys_join_fields_in_order() {
        let keys = KeyExtractor::composite(["/order", "/step"]);
        let key = keys
            .extract(&msg(r#"{"step":"charge","order":7}"#))
            .expect("valid");
        assert_eq!(key.as_str(), "7:charge");
        assert!(matches!(
            keys.extract(&msg(r#"{"order":7}"#)),
            Err(KeyProblem::Missing { .. })
        ));
        assert!(matches!(
            keys.extract(&msg(r#"{"order":"a:b","step":"x"}"#)),
            Err(KeyProblem::Invalid {
                error: KeyError::InvalidPart { .. },
                ..
            })
        ));
    }

    #[test]
    fn a_hash_of_chosen_fields_keys_a_message_by_its_immutable_parts() {
        let keys = KeyExtractor::new(
            "fields:/account,/amount"
                .parse::<JsonKey>()
                .expect("spec")
                .into(),
        );
        let a = keys
            .extract(&msg(r#"{"account":"a1","amount":5,"sent_at":1}"#))
            .expect("valid");
        let b = keys
            .extract(&msg(r#"{"sent_at":2,"amount":5,"account":"a1"}"#))
            .expect("valid");
        assert_eq!(a, b, "a field outside the chosen ones does not matter");
        let c = keys
            .extract(&msg(r#"{"account":"a1","amount":6}"#))
            .expect("valid");
        assert_ne!(a, c);
        match keys.extract(&msg(r#"{"sent_at":3}"#)) {
            Err(KeyProblem::Missing { tried }) => {
                assert_eq!(tried, r#"hash of fields ["/account", "/amount"]"#);
            }
            other => panic!("expected Missing, got {other:?}"),
        }
    }
}
