//! Request fingerprints: a SHA-256 digest of what must not change under one
//! key. Reusing a key with a different fingerprint is a
//! [`Mismatch`](crate::store::ClaimOutcome::Mismatch), never a silent replay.
//!
//! JSON is canonicalised before hashing, following RFC 8785 (JCS) where
//! practical: object members sorted by their UTF-16 code units, no
//! insignificant whitespace, strings escaped minimally, and numbers
//! normalised so `1`, `1.0` and `1e0` hash alike. One deliberate deviation:
//! integers that fit in 64 bits are kept exact instead of being rounded to
//! an IEEE double, so two order ids above 2^53 never share a fingerprint.
//! Objects with duplicate member names are rejected (RFC 8785 requires
//! I-JSON), because two parsers may disagree on which value wins. Floats
//! are parsed with correct rounding, so a canonical form always parses back
//! to the same number and canonicalises to itself.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};

/// Why a fingerprint could not be computed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The payload was not valid JSON (or was not I-JSON: a duplicate
    /// member name, a number out of range).
    #[error("payload is not valid JSON: {reason}")]
    InvalidJson {
        /// What the parser said, with line and column.
        reason: String,
    },
    /// A field selector was not a valid JSON pointer (RFC 6901).
    #[error(
        "field selector {pointer:?} is not a JSON pointer (rule: empty, or starting with '/')"
    )]
    InvalidPointer {
        /// The selector given.
        pointer: String,
    },
}

/// A 32-byte digest identifying the significant parts of a request.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

const BYTES_DOMAIN: &[u8] = b"idem.fp.v1.bytes\0";
const JSON_DOMAIN: &[u8] = b"idem.fp.v1.json\0";
const FIELDS_DOMAIN: &[u8] = b"idem.fp.v1.fields\0";

impl Fingerprint {
    /// Wraps a digest computed elsewhere (e.g. read back from a store).
    pub const fn from_digest(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The raw digest.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses the 64-character lowercase hex form.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex, &mut out).ok()?;
        Some(Self(out))
    }

    /// The 64-character lowercase hex form.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Fingerprint of raw bytes, taken as they are.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self::digest(&[BYTES_DOMAIN, bytes])
    }

    /// Fingerprint of a whole JSON document, canonicalised first.
    pub fn of_json(json: &[u8]) -> Result<Self, FingerprintError> {
        let canonical = canonical_json(json)?;
        Ok(Self::digest(&[JSON_DOMAIN, &canonical]))
    }

    /// Fingerprint of selected fields of a JSON document, each named by a
    /// JSON pointer (RFC 6901, e.g. `/amount` or `/items/0/sku`). A field
    /// that is absent hashes differently from one that is `null`; fields
    /// not selected may change freely.
    pub fn of_json_fields<P: AsRef<str>>(
        json: &[u8],
        pointers: &[P],
    ) -> Result<Self, FingerprintError> {
        let doc = parse(json)?;
        let mut selected = BTreeMap::new();
        for pointer in pointers {
            let pointer = pointer.as_ref();
            if let Some(value) = doc.pointer(pointer)? {
                selected.insert(SortKey::new(pointer.to_owned()), value.clone());
            }
        }
        let mut out = Vec::new();
        Canonical::Object(selected).write(&mut out);
        Ok(Self::digest(&[FIELDS_DOMAIN, &out]))
    }

    fn digest(parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        for part in parts {
            h.update(part);
        }
        Self(h.finalize().into())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Returns the canonical form of a JSON document (see the module docs).
pub fn canonical_json(json: &[u8]) -> Result<Vec<u8>, FingerprintError> {
    let doc = parse(json)?;
    let mut out = Vec::with_capacity(json.len());
    doc.write(&mut out);
    Ok(out)
}

fn parse(json: &[u8]) -> Result<Canonical, FingerprintError> {
    serde_json::from_slice(json).map_err(|e| FingerprintError::InvalidJson {
        reason: e.to_string(),
    })
}

/// An object member name ordered by UTF-16 code units, as RFC 8785 asks.
#[derive(Clone, PartialEq, Eq)]
struct SortKey(String);

impl SortKey {
    fn new(s: String) -> Self {
        Self(s)
    }
}

impl Ord for SortKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.encode_utf16().cmp(other.0.encode_utf16())
    }
}

impl PartialOrd for SortKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone)]
enum Canonical {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    String(String),
    Array(Vec<Canonical>),
    Object(BTreeMap<SortKey, Canonical>),
}

impl Canonical {
    fn pointer(&self, pointer: &str) -> Result<Option<&Canonical>, FingerprintError> {
        if pointer.is_empty() {
            return Ok(Some(self));
        }
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(FingerprintError::InvalidPointer {
                pointer: pointer.to_owned(),
            });
        };
        let mut node = self;
        for token in rest.split('/') {
            let token = token.replace("~1", "/").replace("~0", "~");
            let next = match node {
                Canonical::Object(map) => map.get(&SortKey::new(token)),
                Canonical::Array(items) => array_index(&token).and_then(|i| items.get(i)),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => return Ok(None),
            }
        }
        Ok(Some(node))
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Canonical::Null => out.extend_from_slice(b"null"),
            Canonical::Bool(true) => out.extend_from_slice(b"true"),
            Canonical::Bool(false) => out.extend_from_slice(b"false"),
            Canonical::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
            Canonical::Float(f) => write_es_number(*f, out),
            Canonical::String(s) => write_string(s, out),
            Canonical::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Canonical::Object(map) => {
                out.push(b'{');
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(&k.0, out);
                    out.push(b':');
                    v.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

/// RFC 6901 array index: `0` or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.is_empty() || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    if !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    token.parse().ok()
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json escapes exactly as RFC 8785 asks: `"` `\` and control
    // characters only, short forms where they exist, `\u00xx` lowercase.
    serde_json::to_writer(&mut *out, s).expect("writing a str to a Vec cannot fail");
}

/// Writes a finite double the way ECMAScript's `Number.prototype.toString`
/// does (RFC 8785 §3.2.2.3), except that integral values below 2^53 are
/// written as integers by the caller.
fn write_es_number(f: f64, out: &mut Vec<u8>) {
    if f == 0.0 {
        out.push(b'0');
        return;
    }
    if f < 0.0 {
        out.push(b'-');
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "d.ddde-x".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let k = digits.len() as i32;
    let n = exp + 1; // value = 0.digits × 10^n
    let s = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let sign = if n - 1 < 0 { '-' } else { '+' };
        let (first, rest) = digits.split_at(1);
        if rest.is_empty() {
            format!("{first}e{sign}{}", (n - 1).abs())
        } else {
            format!("{first}.{rest}e{sign}{}", (n - 1).abs())
        }
    };
    out.extend_from_slice(s.as_bytes());
}

const TWO_POW_53: f64 = 9_007_199_254_740_992.0;

impl<'de> Deserialize<'de> for Canonical {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CanonicalVisitor)
    }
}

struct CanonicalVisitor;

impl<'de> Visitor<'de> for CanonicalVisitor {
    type Value = Canonical;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Canonical, E> {
        Ok(Canonical::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Canonical, E> {
        Ok(Canonical::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Canonical, E> {
        Ok(Canonical::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Canonical, E> {
        Ok(Canonical::Int(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Canonical, E> {
        if !v.is_finite() {
            return Err(E::custom("number out of range"));
        }
        if v.fract() == 0.0 && v.abs() < TWO_POW_53 {
            // Exact: |v| < 2^53 and integral. `-0.0` becomes 0 as in JCS.
            return Ok(Canonical::Int(v as i128));
        }
        Ok(Canonical::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Canonical, E> {
        Ok(Canonical::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Canonical, E> {
        Ok(Canonical::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Canonical, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Canonical::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Canonical, A::Error> {
        let mut members = BTreeMap::new();
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value()?;
            let key = SortKey::new(name);
            if members.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate member name {:?}",
                    key.0
                )));
            }
            members.insert(key, value);
        }
        Ok(Canonical::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        String::from_utf8(canonical_json(s.as_bytes()).expect("valid json")).expect("utf8")
    }

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        assert_eq!(
            canon(r#" { "b" : 1, "a" : [ 1 , 2 ] } "#),
            r#"{"a":[1,2],"b":1}"#
        );
        assert_eq!(
            Fingerprint::of_json(br#"{"b":1,"a":2}"#).expect("valid"),
            Fingerprint::of_json(br#"{ "a": 2, "b": 1 }"#).expect("valid")
        );
    }

    #[test]
    fn sorts_by_utf16_code_units() {
        // RFC 8785 §3.2.3: U+1F600 (surrogates D83D..) sorts before U+FB01.
        assert_eq!(
            canon("{\"\u{fb01}\":1,\"\u{1f600}\":2}"),
            "{\"\u{1f600}\":2,\"\u{fb01}\":1}"
        );
    }

    #[test]
    fn normalises_numbers() {
        assert_eq!(canon("[1, 1.0, 1e0, 10e-1, -0.0, 0]"), "[1,1,1,1,0,0]");
        assert_eq!(
            canon("[1e21, 1e-7, 0.000001, 123.456, 1.5e300]"),
            "[1e+21,1e-7,0.000001,123.456,1.5e+300]"
        );
        assert_eq!(
            canon("[100000000000000000000, 4.5]"),
            "[100000000000000000000,4.5]"
        );
        // Integers within 64 bits stay exact (the one deviation from JCS).
        assert_eq!(
            canon("[9007199254740993, -9223372036854775808]"),
            "[9007199254740993,-9223372036854775808]"
        );
    }

    #[test]
    fn canonical_numbers_reparse_to_themselves() {
        // Found by the fingerprint_json fuzz target: without correctly
        // rounded float parsing the canonical form of this integer-like
        // float re-canonicalised to different digits, so two spellings of
        // one number could fingerprint differently.
        for input in [
            "4176484073467440737095531",
            "4.176484073467441e+24",
            "0.1",
            "5e-324",
            "1.7976931348623157e308",
        ] {
            let once = canonical_json(input.as_bytes()).expect("valid");
            let twice = canonical_json(&once).expect("valid");
            assert_eq!(once, twice, "{input}");
        }
        assert_eq!(canon("4176484073467440737095531"), "4.1764840734674405e+24");
    }

    #[test]
    fn escapes_strings_minimally() {
        assert_eq!(canon(r#""\u00e9\/\u001f\n""#), "\"é/\\u001f\\n\"");
    }

    #[test]
    fn rejects_broken_json_with_a_reason() {
        for bad in [
            "",
            "{",
            "{\"a\":}",
            "[1,]",
            "nul",
            "{\"a\":1,\"a\":2}",
            "1e400",
            "\"\\ud800\"",
        ] {
            let err = Fingerprint::of_json(bad.as_bytes()).expect_err(bad);
            assert!(
                matches!(err, FingerprintError::InvalidJson { .. }),
                "{bad}: {err}"
            );
        }
        let dup = Fingerprint::of_json(br#"{"a":1,"a":2}"#).expect_err("duplicate");
        assert!(
            dup.to_string().contains("duplicate member name \"a\""),
            "{dup}"
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let deep = "[".repeat(100_000);
        assert!(Fingerprint::of_json(deep.as_bytes()).is_err());
    }

    #[test]
    fn selected_fields_ignore_the_rest() {
        let a = br#"{"amount":100,"currency":"EUR","note":"first"}"#;
        let b = br#"{"note":"second","currency":"EUR","amount":100.0}"#;
        let c = br#"{"amount":101,"currency":"EUR"}"#;
        let f = |j: &[u8]| Fingerprint::of_json_fields(j, &["/amount", "/currency"]).expect("ok");
        assert_eq!(f(a), f(b));
        assert_ne!(f(a), f(c));
        // Absent differs from null.
        assert_ne!(
            f(br#"{"amount":100}"#),
            f(br#"{"amount":100,"currency":null}"#)
        );
        assert!(matches!(
            Fingerprint::of_json_fields(a, &["amount"]),
            Err(FingerprintError::InvalidPointer { .. })
        ));
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        let doc = br#"{"a/b":{"m~n":[10,20]},"items":[{"sku":"x"}]}"#;
        let one = |p: &str| Fingerprint::of_json_fields(doc, &[p]).expect("ok");
        assert_ne!(one("/a~1b/m~0n/1"), one("/missing"));
        assert_eq!(
            one("/items/01"),
            one("/missing"),
            "leading zero is not an index"
        );
        assert_eq!(
            one("/items/0/sku"),
            Fingerprint::of_json_fields(br#"{"items":[{"sku":"x"}]}"#, &["/items/0/sku"])
                .expect("ok")
        );
    }

    #[test]
    fn bytes_and_json_are_separate_domains() {
        assert_ne!(
            Fingerprint::of_bytes(b"1"),
            Fingerprint::of_json(b"1").expect("ok")
        );
        let fp = Fingerprint::of_bytes(b"x");
        assert_eq!(Fingerprint::from_hex(&fp.to_hex()), Some(fp));
        assert_eq!(Fingerprint::from_hex("zz"), None);
    }
}
