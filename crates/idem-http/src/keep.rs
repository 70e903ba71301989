//! What a route keeps of a response for its replays ([`ReplayPolicy`]),
//! chosen per path prefix ([`KeepRules`]).
//!
//! The client whose request ran always gets the whole response; only what
//! is stored, and so replayed, is reduced.

use std::fmt;
use std::str::FromStr;

use http::HeaderName;

use crate::stored::{Kept, StoredResponse};

/// What a redacted value is replaced with, in a JSON body or a header.
pub const REDACTED: &str = "[redacted]";

/// What is stored of a response for its replays.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayPolicy {
    /// The whole response, byte for byte (the default).
    #[default]
    Full,
    /// The status, the trailers and only the named headers; no body. A
    /// replay answers the stored status with an empty body. For endpoints
    /// whose answer is a secret (a minted credential) or too large to
    /// keep, where "it was done" is what a retry needs to know.
    StatusOnly {
        /// The headers kept (`location`, say); others are left out.
        headers: Vec<HeaderName>,
    },
    /// The response with the values at these JSON pointers of its body,
    /// and of these headers, replaced by `"[redacted]"` before it is
    /// stored. A body that is not JSON cannot be redacted, so none of it
    /// is kept (as under [`StatusOnly`](Self::StatusOnly)).
    Redacted {
        /// JSON pointers into the body (`/card/number`).
        pointers: Vec<String>,
        /// Headers whose values are replaced.
        headers: Vec<HeaderName>,
    },
    /// The whole response, its body kept in the layer's blob store when it
    /// is longer than `threshold` bytes (the record keeps the blob's
    /// locator, digest and length), inline when it is not. Replays stream
    /// the body from the blob, checked against its digest. For responses
    /// too large for the record store, up to the blob store's limit.
    Reference {
        /// The longest body kept inline in the record.
        threshold: usize,
    },
}

/// The inline threshold of `reference` when none is given: 64 KiB.
pub const DEFAULT_REFERENCE_THRESHOLD: usize = 64 * 1024;

impl ReplayPolicy {
    /// Whether no body is stored under this policy.
    pub fn drops_body(&self) -> bool {
        matches!(self, Self::StatusOnly { .. })
    }

    /// The longest body kept inline under [`Reference`](Self::Reference).
    pub fn reference_threshold(&self) -> Option<usize> {
        match self {
            Self::Reference { threshold } => Some(*threshold),
            _ => None,
        }
    }

    /// What is stored of `response` under this policy; `None` under
    /// [`Full`](Self::Full): store it as it is.
    pub fn reduce(&self, response: &StoredResponse) -> Option<StoredResponse> {
        match self {
            Self::Full | Self::Reference { .. } => None,
            Self::StatusOnly { headers } => Some(status_only(response, headers)),
            Self::Redacted { pointers, headers } => Some(redacted(response, pointers, headers)),
        }
    }
}

fn status_only(response: &StoredResponse, keep: &[HeaderName]) -> StoredResponse {
    StoredResponse {
        status: response.status,
        headers: response
            .headers
            .iter()
            .filter(|(name, _)| keep.iter().any(|k| k.as_str().eq_ignore_ascii_case(name)))
            .cloned()
            .collect(),
        body: serde_bytes::ByteBuf::new(),
        trailers: response.trailers.clone(),
        kept: Kept::StatusOnly,
    }
}

fn redacted(
    response: &StoredResponse,
    pointers: &[String],
    hidden: &[HeaderName],
) -> StoredResponse {
    let hide = |name: &str| hidden.iter().any(|h| h.as_str().eq_ignore_ascii_case(name));
    let headers = response
        .headers
        .iter()
        // Its body changes length; the replay's is counted again.
        .filter(|(name, _)| !name.eq_ignore_ascii_case("content-length"))
        .map(|(name, value)| {
            if hide(name) {
                (
                    name.clone(),
                    serde_bytes::ByteBuf::from(REDACTED.as_bytes().to_vec()),
                )
            } else {
                (name.clone(), value.clone())
            }
        })
        .collect();
    let body = if response.body.is_empty() || pointers.is_empty() {
        Some(response.body.to_vec())
    } else {
        serde_json::from_slice::<serde_json::Value>(&response.body)
            .ok()
            .and_then(|mut json| {
                for pointer in pointers {
                    if let Some(value) = json.pointer_mut(pointer) {
                        *value = serde_json::Value::String(REDACTED.to_owned());
                    }
                }
                serde_json::to_vec(&json).ok()
            })
    };
    match body {
        Some(body) => StoredResponse {
            status: response.status,
            headers,
            body: serde_bytes::ByteBuf::from(body),
            trailers: response.trailers.clone(),
            kept: Kept::Redacted,
        },
        // Not JSON: what it holds cannot be told apart, so none of it is kept.
        None => StoredResponse {
            status: response.status,
            headers: headers
                .into_iter()
                .filter(|(name, _)| !name.eq_ignore_ascii_case("content-type"))
                .collect(),
            body: serde_bytes::ByteBuf::new(),
            trailers: response.trailers.clone(),
            kept: Kept::StatusOnly,
        },
    }
}

/// A policy that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

/// The text form: `full`; `status-only`, or `status-only:` and the headers
/// kept (`status-only:location,etag`); `redacted:` and what is redacted,
/// comma-separated: JSON pointers (beginning with `/`) and header names
/// (`redacted:/card/number,/token,x-api-key`); `reference`, or
/// `reference:` and the inline threshold in bytes (`reference:1MiB`;
/// suffixes `KiB`, `MiB`).
impl FromStr for ReplayPolicy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Self, PolicyError> {
        let (name, list) = match text.trim().split_once(':') {
            Some((name, list)) => (name.trim(), Some(list)),
            None => (text.trim(), None),
        };
        let items = || {
            list.unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
        };
        let header = |item: &str| {
            HeaderName::from_bytes(item.as_bytes()).map_err(|_| {
                PolicyError(format!(
                    "{item:?} is neither a JSON pointer nor a header name"
                ))
            })
        };
        match name {
            "full" if list.is_none() => Ok(Self::Full),
            "reference" => Ok(Self::Reference {
                threshold: match list {
                    None => DEFAULT_REFERENCE_THRESHOLD,
                    Some(size) => parse_size(size)?,
                },
            }),
            "status-only" => Ok(Self::StatusOnly {
                headers: items().map(header).collect::<Result<_, _>>()?,
            }),
            "redacted" => {
                let (pointers, headers): (Vec<&str>, Vec<&str>) =
                    items().partition(|item| item.starts_with('/'));
                if pointers.is_empty() && headers.is_empty() {
                    return Err(PolicyError(
                        "redacted needs what to redact: redacted:/json/pointer,header-name".into(),
                    ));
                }
                Ok(Self::Redacted {
                    pointers: pointers.into_iter().map(str::to_owned).collect(),
                    headers: headers.into_iter().map(header).collect::<Result<_, _>>()?,
                })
            }
            _ => Err(PolicyError(format!(
                "{text:?} is not a replay policy: full, status-only[:headers], \
                 redacted:pointers,headers or reference[:threshold]"
            ))),
        }
    }
}

/// A size in bytes, with an optional `KiB` or `MiB` suffix.
fn parse_size(text: &str) -> Result<usize, PolicyError> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let unit = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        _ => 0,
    };
    digits
        .parse::<usize>()
        .ok()
        .filter(|_| unit > 0)
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| {
            PolicyError(format!(
                "{text:?} is not a size: bytes, or a number and KiB or MiB (reference:1MiB)"
            ))
        })
}

impl fmt::Display for ReplayPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |items: Vec<&str>| items.join(",");
        match self {
            Self::Full => f.write_str("full"),
            Self::Reference { threshold } if *threshold == DEFAULT_REFERENCE_THRESHOLD => {
                f.write_str("reference")
            }
            Self::Reference { threshold } => write!(f, "reference:{threshold}"),
            Self::StatusOnly { headers } if headers.is_empty() => f.write_str("status-only"),
            Self::StatusOnly { headers } => write!(
                f,
                "status-only:{}",
                join(headers.iter().map(HeaderName::as_str).collect())
            ),
            Self::Redacted { pointers, headers } => write!(
                f,
                "redacted:{}",
                join(
                    pointers
                        .iter()
                        .map(String::as_str)
                        .chain(headers.iter().map(HeaderName::as_str))
                        .collect()
                )
            ),
        }
    }
}

/// Policies by path prefix: a request gets the policy of the longest
/// prefix that matches its path whole segments at a time (`/v1/tokens`
/// matches `/v1/tokens` and `/v1/tokens/7`, not `/v1/tokensx`), else the
/// default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeepRules {
    default: ReplayPolicy,
    routes: Vec<(String, ReplayPolicy)>,
}

impl KeepRules {
    /// Every path gets `policy` unless a prefix says otherwise.
    pub fn set_default(&mut self, policy: ReplayPolicy) {
        self.default = policy;
    }

    /// Paths under `prefix` get `policy`.
    pub fn set(&mut self, prefix: &str, policy: ReplayPolicy) {
        let prefix = prefix.trim_end_matches('/').to_owned();
        self.routes.retain(|(known, _)| *known != prefix);
        self.routes.push((prefix, policy));
    }

    /// The policy for `path`.
    pub fn for_path(&self, path: &str) -> &ReplayPolicy {
        self.routes
            .iter()
            .filter(|(prefix, _)| {
                path.strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            })
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(&self.default, |(_, policy)| policy)
    }

    /// Whether any path keeps bodies by reference.
    pub fn any_reference(&self) -> bool {
        std::iter::once(&self.default)
            .chain(self.routes.iter().map(|(_, policy)| policy))
            .any(|policy| policy.reference_threshold().is_some())
    }

    /// Parses `POLICY` (every path) or `PREFIX=POLICY` entries separated
    /// by `;` (`status-only;/v1/users=redacted:/ssn`).
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let mut rules = Self::default();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            match entry.split_once('=') {
                Some((prefix, policy)) if prefix.trim().starts_with('/') => {
                    rules.set(prefix.trim(), policy.parse()?);
                }
                Some(_) => {
                    return Err(PolicyError(format!(
                        "{entry:?}: a route prefix begins with '/' (PREFIX=POLICY)"
                    )))
                }
                None => rules.set_default(entry.parse()?),
            }
        }
        Ok(rules)
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::*;

    fn response(body: &str, content_type: &str) -> StoredResponse {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            HeaderValue::from_str(content_type).expect("value"),
        );
        headers.insert("content-length", HeaderValue::from(body.len()));
        headers.insert("location", HeaderValue::from_static("/tokens/9"));
        headers.insert("x-api-key", HeaderValue::from_static("key-secret"));
        StoredResponse::new(StatusCode::CREATED, headers, body.to_owned().into())
    }

    fn header<'a>(stored: &'a StoredResponse, name: &str) -> Option<&'a [u8]> {
        stored
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    #[test]
    fn status_only_keeps_the_status_and_chosen_headers() {
        let policy: ReplayPolicy = "status-only:location".parse().expect("parses");
        let kept = policy
            .reduce(&response(r#"{"token":"tok_secret"}"#, "application/json"))
            .expect("reduced");
        assert_eq!((kept.status, kept.kept.clone()), (201, Kept::StatusOnly));
        assert!(kept.body.is_empty());
        assert_eq!(header(&kept, "location"), Some(&b"/tokens/9"[..]));
        assert_eq!(kept.headers.len(), 1);
        assert_eq!(ReplayPolicy::Full.reduce(&kept), None);
    }

    #[test]
    fn redaction_replaces_values_at_pointers_and_in_headers() {
        let policy: ReplayPolicy = "redacted:/card/number,/missing,x-api-key"
            .parse()
            .expect("parses");
        let kept = policy
            .reduce(&response(
                r#"{"id":7,"card":{"number":"4242424242424242","brand":"visa"}}"#,
                "application/json",
            ))
            .expect("reduced");
        assert_eq!(kept.kept, Kept::Redacted);
        let json: serde_json::Value = serde_json::from_slice(&kept.body).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"id":7,"card":{"number":REDACTED,"brand":"visa"}})
        );
        assert_eq!(header(&kept, "x-api-key"), Some(REDACTED.as_bytes()));
        assert_eq!(header(&kept, "content-length"), None);
        let text = policy
            .reduce(&response("card 4242424242424242", "text/plain"))
            .expect("reduced");
        assert_eq!(text.kept, Kept::StatusOnly);
        assert!(text.body.is_empty());
    }

    #[test]
    fn the_text_form_round_trips_and_bad_forms_are_named() {
        for text in [
            "full",
            "status-only",
            "status-only:location,etag",
            "redacted:/a,/b/c,x-key",
            "reference",
            "reference:1000",
        ] {
            let policy: ReplayPolicy = text.parse().expect(text);
            assert_eq!(policy.to_string(), text);
        }
        assert!("redacted".parse::<ReplayPolicy>().is_err());
        assert!("keep-it".parse::<ReplayPolicy>().is_err());
        assert!("redacted:bad header".parse::<ReplayPolicy>().is_err());
        assert_eq!(
            "reference:2MiB".parse::<ReplayPolicy>(),
            Ok(ReplayPolicy::Reference { threshold: 2 << 20 })
        );
        assert!("reference:2GB".parse::<ReplayPolicy>().is_err());
        assert!("reference:-1".parse::<ReplayPolicy>().is_err());
    }

    #[test]
    fn the_longest_matching_prefix_wins_by_whole_segments() {
        let rules = KeepRules::parse("status-only; /v1/users=redacted:/ssn; /v1/users/admin/=full")
            .expect("parses");
        assert_eq!(
            rules.for_path("/v1/orders"),
            &ReplayPolicy::StatusOnly { headers: vec![] }
        );
        assert!(matches!(
            rules.for_path("/v1/users/7"),
            ReplayPolicy::Redacted { .. }
        ));
        assert!(matches!(
            rules.for_path("/v1/users"),
            ReplayPolicy::Redacted { .. }
        ));
        assert!(matches!(
            rules.for_path("/v1/usersx"),
            ReplayPolicy::StatusOnly { .. }
        ));
        assert_eq!(rules.for_path("/v1/users/admin/1"), &ReplayPolicy::Full);
        assert!(KeepRules::parse("v1=full").is_err());
        assert_eq!(
            KeepRules::parse("").expect("empty").for_path("/x"),
            &ReplayPolicy::Full
        );
    }
}
