//! Keys read from a JSON document: one field, several fields joined, or a
//! hash of chosen fields. The broker consumers read them from a payload,
//! the HTTP layer and the gateway from a request body; both call this.

use serde_json::Value;

use super::composite;
use crate::fingerprint::Fingerprint;
use crate::key::{Key, KeyError, KeyRules};

/// Where in a JSON document a key is read from.
///
/// ```
/// use idem::derive::json::{JsonDoc, JsonKey};
/// use idem::KeyRules;
///
/// let body = br#"{"type":"charge","data":{"id":"ch_42","amount":100}}"#;
/// let rules = KeyRules::default();
/// let key = JsonKey::Pointer("/data/id".into())
///     .read(&mut JsonDoc::new(body), &rules)
///     .unwrap();
/// assert_eq!(key.unwrap().as_str(), "ch_42");
///
/// // A hash of chosen fields: member order and whitespace do not matter.
/// let fields = JsonKey::Fields(vec!["/data/id".into(), "/type".into()]);
/// let other = br#"{ "data": {"amount": 7, "id": "ch_42"}, "type": "charge" }"#;
/// assert_eq!(
///     fields.read(&mut JsonDoc::new(body), &rules).unwrap(),
///     fields.read(&mut JsonDoc::new(other), &rules).unwrap(),
/// );
/// ```
///
/// The set is closed on purpose: each user of it (the consumers, the HTTP
/// layer) matches every variant, so a new kind of source is a compile
/// error where it is not handled yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JsonKey {
    /// A string, or an integer in decimal, at a JSON pointer (RFC 6901),
    /// e.g. `/order/id`.
    Pointer(String),
    /// Several pointers' values joined with `:` in order, as
    /// [`composite`] joins them: `["/order_id", "/step"]`. Absent when any
    /// of them is absent.
    Composite(Vec<String>),
    /// The hex SHA-256 of the canonical JSON of these fields (as
    /// [`Fingerprint::of_json_fields`] digests them): a key from a
    /// request's immutable fields when it carries no id of its own.
    /// Absent fields are left out of the hash; absent when none is there.
    Fields(Vec<String>),
}

/// Why a JSON key source gave no usable key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JsonKeyError {
    /// The document is not JSON.
    #[error("the document is not JSON, so {source_name} cannot be read: {reason}")]
    NotJson {
        /// The source that needed JSON.
        source_name: String,
        /// The parser's complaint.
        reason: String,
    },
    /// A pointer found something other than a string or an integer.
    #[error("{source_name} is {found}, not a string or an integer")]
    WrongType {
        /// The pointer.
        source_name: String,
        /// What was found there, e.g. `an object`.
        found: &'static str,
    },
    /// The value was read, but breaks the key rules.
    #[error("idempotency key from {source_name} is invalid: {error}")]
    Invalid {
        /// The source.
        source_name: String,
        /// The rule it broke.
        error: KeyError,
    },
    /// The source itself is unusable (see [`JsonKey::check`]).
    #[error("{source_name} is not a usable key source: {problem}")]
    Unusable {
        /// The source.
        source_name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl JsonKey {
    /// Checks the source before it is used: pointers must be empty or
    /// start with `/` (RFC 6901), and lists must name at least one field.
    pub fn check(&self) -> Result<(), JsonKeyError> {
        let unusable = |problem| JsonKeyError::Unusable {
            source_name: self.to_string(),
            problem,
        };
        let pointers: &[String] = match self {
            Self::Pointer(pointer) => std::slice::from_ref(pointer),
            Self::Composite(pointers) | Self::Fields(pointers) => pointers,
        };
        if pointers.is_empty() {
            return Err(unusable("it names no field"));
        }
        if pointers
            .iter()
            .any(|p| !p.is_empty() && !p.starts_with('/'))
        {
            return Err(unusable(
                "a field is not a JSON pointer (rule: empty, or starting with '/')",
            ));
        }
        Ok(())
    }

    /// The key in `doc`: `Ok(None)` when it is absent (or null), so the
    /// caller's rule for a missing key applies.
    pub fn read(
        &self,
        doc: &mut JsonDoc<'_>,
        rules: &KeyRules,
    ) -> Result<Option<Key>, JsonKeyError> {
        match self {
            Self::Pointer(pointer) => pointer_key(doc, pointer, rules),
            Self::Composite(pointers) => composite_key(doc, pointers, rules),
            Self::Fields(fields) => fields_key(doc, fields),
        }
    }
}

/// The text form of a [`JsonKey`], as configuration files and flags
/// write it: `/data/id` (a pointer), `composite:/order_id,/step` or
/// `fields:/account,/amount`. The parsed source is [checked](JsonKey::check).
///
/// ```
/// use idem::derive::json::JsonKey;
///
/// assert_eq!("/id".parse(), Ok(JsonKey::Pointer("/id".into())));
/// assert_eq!(
///     "fields:/to, /amount".parse(),
///     Ok(JsonKey::Fields(vec!["/to".into(), "/amount".into()]))
/// );
/// assert!("id".parse::<JsonKey>().is_err());
/// ```
impl std::str::FromStr for JsonKey {
    type Err = JsonKeyError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let list = |rest: &str| rest.split(',').map(|p| p.trim().to_owned()).collect();
        let source = if let Some(rest) = spec.strip_prefix("fields:") {
            Self::Fields(list(rest))
        } else if let Some(rest) = spec.strip_prefix("composite:") {
            Self::Composite(list(rest))
        } else {
            Self::Pointer(spec.to_owned())
        };
        source.check()?;
        Ok(source)
    }
}

impl std::fmt::Display for JsonKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pointer(pointer) => write!(f, "JSON pointer {pointer:?}"),
            Self::Composite(pointers) => write!(f, "composite {pointers:?}"),
            Self::Fields(fields) => write!(f, "hash of fields {fields:?}"),
        }
    }
}

/// A JSON document, parsed at most once, when a key source first needs
/// it.
#[derive(Debug)]
pub struct JsonDoc<'a> {
    bytes: &'a [u8],
    parsed: Option<Result<Value, String>>,
}

impl<'a> JsonDoc<'a> {
    /// The document in `bytes`, not parsed yet.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            parsed: None,
        }
    }

    /// The document's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The parsed document, or the parser's complaint.
    pub fn value(&mut self) -> Result<&Value, &str> {
        let bytes = self.bytes;
        self.parsed
            .get_or_insert_with(|| serde_json::from_slice(bytes).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(String::as_str)
    }

    fn value_for(&mut self, source: impl FnOnce() -> String) -> Result<&Value, JsonKeyError> {
        self.value().map_err(|reason| JsonKeyError::NotJson {
            source_name: source(),
            reason: reason.to_owned(),
        })
    }
}

/// [`JsonKey::Pointer`] without building one.
pub fn pointer_key(
    doc: &mut JsonDoc<'_>,
    pointer: &str,
    rules: &KeyRules,
) -> Result<Option<Key>, JsonKeyError> {
    let name = || format!("JSON pointer {pointer:?}");
    let Some(raw) = scalar(doc.value_for(name)?, pointer)? else {
        return Ok(None);
    };
    rules
        .parse(&raw)
        .map(Some)
        .map_err(|error| JsonKeyError::Invalid {
            source_name: name(),
            error,
        })
}

/// [`JsonKey::Composite`] without building one.
pub fn composite_key<P: AsRef<str>>(
    doc: &mut JsonDoc<'_>,
    pointers: &[P],
    rules: &KeyRules,
) -> Result<Option<Key>, JsonKeyError> {
    let name = || {
        let pointers: Vec<&str> = pointers.iter().map(AsRef::as_ref).collect();
        format!("composite {pointers:?}")
    };
    let value = doc.value_for(name)?;
    let mut parts = Vec::with_capacity(pointers.len());
    for pointer in pointers {
        match scalar(value, pointer.as_ref())? {
            Some(part) => parts.push(part),
            None => return Ok(None),
        }
    }
    composite(&parts)
        .and_then(|key| rules.parse(key.as_str()))
        .map(Some)
        .map_err(|error| JsonKeyError::Invalid {
            source_name: name(),
            error,
        })
}

/// [`JsonKey::Fields`] without building one.
pub fn fields_key<P: AsRef<str>>(
    doc: &mut JsonDoc<'_>,
    fields: &[P],
) -> Result<Option<Key>, JsonKeyError> {
    let name = || {
        let fields: Vec<&str> = fields.iter().map(AsRef::as_ref).collect();
        format!("hash of fields {fields:?}")
    };
    let value = doc.value_for(name)?;
    if !fields.iter().any(|f| value.pointer(f.as_ref()).is_some()) {
        return Ok(None);
    }
    let digest =
        Fingerprint::of_json_fields(doc.bytes(), fields).map_err(|e| JsonKeyError::NotJson {
            source_name: name(),
            reason: e.to_string(),
        })?;
    Ok(Some(
        Key::new(&digest.to_hex()).expect("64 hex digits are a valid key"),
    ))
}

/// A string, or an integer in decimal; `None` when absent or null.
fn scalar(value: &Value, pointer: &str) -> Result<Option<String>, JsonKeyError> {
    let wrong = |found| JsonKeyError::WrongType {
        source_name: format!("JSON pointer {pointer:?}"),
        found,
    };
    match value.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(Some(n.to_string())),
        Some(Value::Number(_)) => Err(wrong("a fractional number")),
        Some(Value::Bool(_)) => Err(wrong("a boolean")),
        Some(Value::Array(_)) => Err(wrong("an array")),
        Some(Value::Object(_)) => Err(wrong("an object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(source: &JsonKey, body: &str) -> Result<Option<Key>, JsonKeyError> {
        source.read(&mut JsonDoc::new(body.as_bytes()), &KeyRules::default())
    }

    #[test]
    fn a_hash_of_fields_ignores_the_others_and_absent_means_no_key() {
        let fields = JsonKey::Fields(vec!["/amount".into(), "/to".into()]);
        let a = read(&fields, r#"{"amount":5,"to":"acct_1","note":"x"}"#).expect("read");
        let b = read(&fields, r#"{"note":"y","to":"acct_1","amount":5}"#).expect("read");
        let c = read(&fields, r#"{"amount":6,"to":"acct_1"}"#).expect("read");
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(read(&fields, r#"{"note":"x"}"#).expect("read"), None);
        assert!(matches!(
            read(&fields, "{broken"),
            Err(JsonKeyError::NotJson { .. })
        ));
    }

    #[test]
    fn unusable_sources_are_refused_before_use() {
        for source in [
            JsonKey::Pointer("id".into()),
            JsonKey::Composite(vec![]),
            JsonKey::Fields(vec!["/a".into(), "b".into()]),
        ] {
            assert!(
                matches!(source.check(), Err(JsonKeyError::Unusable { .. })),
                "{source}"
            );
        }
        assert!(JsonKey::Pointer(String::new()).check().is_ok());
        assert!(JsonKey::Composite(vec!["/a".into(), "/b".into()])
            .check()
            .is_ok());
    }

    #[test]
    fn pointers_read_strings_and_integers_only() {
        let id = JsonKey::Pointer("/id".into());
        assert_eq!(
            read(&id, r#"{"id":42}"#)
                .expect("read")
                .expect("present")
                .as_str(),
            "42"
        );
        assert_eq!(read(&id, r#"{"id":null}"#).expect("read"), None);
        assert!(matches!(
            read(&id, r#"{"id":1.5}"#),
            Err(JsonKeyError::WrongType {
                found: "a fractional number",
                ..
            })
        ));
        assert!(matches!(
            read(&id, r#"{"id":"has space"}"#),
            Err(JsonKeyError::Invalid { .. })
        ));
    }
}
