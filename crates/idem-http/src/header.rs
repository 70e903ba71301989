//! Reading the `Idempotency-Key` header value.
//!
//! The IETF draft makes the value an RFC 8941 sf-string (`"8e03978e-…"`).
//! Many clients send it bare (`8e03978e-…`, which is not an sf-token when
//! it starts with a digit), so a bare value is accepted too. Either way the
//! key itself must then pass the key rules (docs/design.md §2): 1..=255 bytes of
//! visible ASCII by default.

use http::HeaderValue;
use idem::{Key, KeyError, KeyRules};

/// Why an `Idempotency-Key` header was refused. Each says which rule was
/// broken; the middleware answers 400 with it as the problem's `detail`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyHeaderError {
    /// The header appeared more than once.
    #[error("the {header} header appears {count} times (rule: exactly once)")]
    Repeated {
        /// The header's name.
        header: String,
        /// How many times it appeared.
        count: usize,
    },
    /// The value held bytes that are not visible ASCII, space or tab.
    #[error("the {header} header is not ASCII text (rule: visible ASCII)")]
    NotAscii {
        /// The header's name.
        header: String,
    },
    /// A quoted value was not a valid RFC 8941 sf-string.
    #[error("the {header} header is not a valid sf-string: {problem} (rule: RFC 8941 §3.3.3)")]
    BadString {
        /// The header's name.
        header: String,
        /// What was wrong.
        problem: &'static str,
    },
    /// The key inside broke a key rule.
    #[error("the {header} header")]
    Key {
        /// The header's name.
        header: String,
        /// The rule broken.
        #[source]
        source: KeyError,
    },
}

/// Parses one header value as an sf-string or a bare key, then checks the
/// key against `rules`.
pub fn parse_key(
    header: &str,
    value: &HeaderValue,
    rules: &KeyRules,
) -> Result<Key, KeyHeaderError> {
    let text = value.to_str().map_err(|_| KeyHeaderError::NotAscii {
        header: header.to_owned(),
    })?;
    let text = text.trim_matches([' ', '\t']);
    let raw = if let Some(quoted) = text.strip_prefix('"') {
        unquote(quoted).map_err(|problem| KeyHeaderError::BadString {
            header: header.to_owned(),
            problem,
        })?
    } else {
        text.to_owned()
    };
    rules.parse(&raw).map_err(|source| KeyHeaderError::Key {
        header: header.to_owned(),
        source,
    })
}

/// The inside of an sf-string whose opening quote was already taken.
fn unquote(rest: &str) -> Result<String, &'static str> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(out)
                } else {
                    Err("characters after the closing quote")
                };
            }
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                Some(_) => return Err("a backslash may only escape '\"' or '\\'"),
                None => return Err("a backslash at the end"),
            },
            ' '..='~' => out.push(c),
            _ => return Err("a character outside printable ASCII"),
        }
    }
    Err("no closing quote")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<String, KeyHeaderError> {
        let value = HeaderValue::from_bytes(raw).expect("a header value");
        parse_key("Idempotency-Key", &value, &KeyRules::default()).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn sf_strings_and_bare_keys_are_accepted() {
        assert_eq!(parse(b"\"abc-123\"").as_deref(), Ok("abc-123"));
        assert_eq!(parse(b"  \"a\\\"b\\\\c\"\t").as_deref(), Ok("a\"b\\c"));
        assert_eq!(
            parse(b"8e03978e-40d5-43e8-bc93-6894a57f9324").as_deref(),
            Ok("8e03978e-40d5-43e8-bc93-6894a57f9324")
        );
    }

    #[test]
    fn each_broken_rule_is_named() {
        let cases: [(&[u8], &str); 8] = [
            (b"\"abc", "no closing quote"),
            (b"\"abc\";p=1", "after the closing quote"),
            (b"\"a\\nb\"", "may only escape"),
            (b"\"a\\", "backslash at the end"),
            (b"\"a b\"", "0x20"),
            (b"\"\"", "empty"),
            (b"caf\xc3\xa9", "not ASCII"),
            (b"a b", "0x20"),
        ];
        for (raw, expected) in cases {
            let err = idem::error_chain(&parse(raw).expect_err("refused"));
            assert!(
                err.contains(expected),
                "{:?}: {err} should mention {expected:?}",
                String::from_utf8_lossy(raw)
            );
        }
        let long = vec![b'k'; 256];
        assert!(idem::error_chain(&parse(&long).expect_err("too long")).contains("at most 255"));
    }
}
