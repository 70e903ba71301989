//! gRPC in the layer: what an upstream's `grpc-status` means for the key,
//! and idem's own answers (problems) said the way gRPC clients read them,
//! as trailers-only statuses (docs/design.md §8).

use std::collections::HashMap;
use std::time::Duration;

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use crate::body::IdemBody;
use crate::problem_types as types;

/// What a `grpc-status` from the upstream does to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// An answer: stored and replayed (OK, and errors such as a declined
    /// card's FAILED_PRECONDITION).
    Stored,
    /// The codes gRPC maps to 5xx, 409 or 429 (UNAVAILABLE, ABORTED,
    /// RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, DATA_LOSS): the key is
    /// released, as for those HTTP statuses (docs/design.md §8's default).
    Released,
    /// The call was cut off while the upstream may have been acting on it
    /// (CANCELLED, UNKNOWN, DEADLINE_EXCEEDED): the outcome is unknown,
    /// the key kept, never run a second time.
    Unknown,
}

/// What `grpc-status` `code` does to the key.
pub(crate) fn verdict(code: &[u8]) -> Verdict {
    match code {
        b"1" | b"2" | b"4" => Verdict::Unknown,
        b"8" | b"10" | b"12" | b"13" | b"14" | b"15" => Verdict::Released,
        _ => Verdict::Stored,
    }
}

/// Whether `headers` are those of a gRPC request or response
/// (`content-type: application/grpc`, `application/grpc+proto`, ...), not
/// gRPC-Web (`application/grpc-web`), whose framing differs.
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|t| {
        let t = t.as_bytes();
        t.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    })
}

/// Which field of a gRPC call's request message holds its key when its
/// metadata has none (AIP-155's `request_id`): per method, or for every
/// method.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestIdFields {
    /// The field for methods not named in `methods`.
    pub(crate) every: Option<u32>,
    /// By method path (`/package.Service/Method`).
    pub(crate) methods: HashMap<String, u32>,
}

impl RequestIdFields {
    /// The field to read for the method at `path`, if any.
    pub(crate) fn field(&self, path: &str) -> Option<u32> {
        self.methods.get(path).copied().or(self.every)
    }
}

/// The string in top-level field `field` of a unary gRPC request's
/// message (AIP-155's `request_id`): `Ok(None)` when the message has no
/// such field; `Err` saying why when the body is not one uncompressed
/// gRPC message that protobuf can read.
pub(crate) fn request_id(body: &[u8], field: u32) -> Result<Option<String>, String> {
    let [compressed, a, b, c, d, message @ ..] = body else {
        return Err("the body is not a gRPC message (shorter than its 5-byte prefix)".into());
    };
    if *compressed != 0 {
        return Err(
            "the message is compressed, so its request_id cannot be read: send the key in \
             the idempotency-key metadata instead"
                .into(),
        );
    }
    let length = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
    if length != message.len() {
        return Err(format!(
            "the body holds {} bytes after its prefix, which says {length}: one unary \
             message is expected",
            message.len()
        ));
    }
    let mut rest = message;
    while !rest.is_empty() {
        let tag = varint(&mut rest)?;
        let (number, wire) = (tag >> 3, tag & 7);
        let len = match wire {
            0 => {
                varint(&mut rest)?;
                0
            }
            1 => 8,
            5 => 4,
            2 => usize::try_from(varint(&mut rest)?).map_err(|_| "a length past memory")?,
            other => return Err(format!("protobuf wire type {other} is not read here")),
        };
        if rest.len() < len {
            return Err("the message ends inside a field".into());
        }
        let (value, after) = rest.split_at(len);
        if wire == 2 && u32::try_from(number) == Ok(field) {
            return String::from_utf8(value.to_vec())
                .map(Some)
                .map_err(|_| format!("field {field} is not a UTF-8 string"));
        }
        rest = after;
    }
    Ok(None)
}

/// Reads one protobuf varint off the front of `bytes`.
fn varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes
            .split_first()
            .ok_or("the message ends inside a number")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a number longer than ten bytes".into())
}

/// gRPC status codes idem answers with.
mod code {
    pub(super) const UNKNOWN: u8 = 2;
    pub(super) const INVALID_ARGUMENT: u8 = 3;
    pub(super) const PERMISSION_DENIED: u8 = 7;
    pub(super) const RESOURCE_EXHAUSTED: u8 = 8;
    pub(super) const FAILED_PRECONDITION: u8 = 9;
    pub(super) const ABORTED: u8 = 10;
    pub(super) const UNIMPLEMENTED: u8 = 12;
    pub(super) const INTERNAL: u8 = 13;
    pub(super) const UNAVAILABLE: u8 = 14;
    pub(super) const DATA_LOSS: u8 = 15;
    pub(super) const UNAUTHENTICATED: u8 = 16;
}

/// The gRPC status of an idem problem, by its `type` (or, for a type this
/// layer does not know, by its HTTP status as gRPC maps statuses):
///
/// - a bad or missing key, an unreadable body: INVALID_ARGUMENT;
/// - a body over the limit: RESOURCE_EXHAUSTED (as gRPC's own limit);
/// - in progress: ABORTED, with the delay in `grpc-retry-pushback-ms`;
/// - the key used with another request, or too old: FAILED_PRECONDITION;
/// - the store or the upstream unreachable: UNAVAILABLE (nothing ran, or
///   the retry gets the stored outcome);
/// - outcome unknown, a response that could not be stored or read back:
///   DATA_LOSS. The call may have taken effect and its answer is gone; a
///   retry gets the same status (not ABORTED, which clients retry).
fn code_of(kind: &str, status: StatusCode) -> u8 {
    match kind {
        types::KEY_MISSING | types::KEY_MALFORMED | types::BAD_BODY | types::BAD_SIGNATURE => {
            code::INVALID_ARGUMENT
        }
        types::BODY_TOO_LARGE => code::RESOURCE_EXHAUSTED,
        types::IN_PROGRESS => code::ABORTED,
        types::MISMATCH | types::KEY_TOO_OLD | types::KEY_EXPIRED => code::FAILED_PRECONDITION,
        types::STORE_UNAVAILABLE | types::UPSTREAM => code::UNAVAILABLE,
        types::OUTCOME_UNKNOWN | types::NOT_STORED | types::STORED_UNREADABLE => code::DATA_LOSS,
        _ => match status.as_u16() {
            400 => code::INTERNAL,
            401 => code::UNAUTHENTICATED,
            403 => code::PERMISSION_DENIED,
            404 => code::UNIMPLEMENTED,
            429 | 502 | 503 | 504 => code::UNAVAILABLE,
            _ => code::UNKNOWN,
        },
    }
}

/// An idem problem as gRPC says it, carried on the problem's response
/// until the layer knows whether the caller speaks gRPC.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    code: u8,
    message: String,
    pushback: Option<Duration>,
}

impl Status {
    /// The status for a problem of this `type`, HTTP status, message and
    /// retry delay.
    pub(crate) fn new(
        kind: &str,
        status: StatusCode,
        message: String,
        pushback: Option<Duration>,
    ) -> Self {
        Self {
            code: code_of(kind, status),
            message,
            pushback,
        }
    }
}

/// `response`, if it is one of idem's problems, as a trailers-only gRPC
/// status (HTTP 200, `grpc-status`, `grpc-message`, and for answers worth
/// retrying `grpc-retry-pushback-ms`); any other response unchanged.
pub(crate) fn answer(response: Response<IdemBody>) -> Response<IdemBody> {
    let Some(status) = response.extensions().get::<Status>().cloned() else {
        return response;
    };
    let (mut parts, _problem) = response.into_parts();
    parts.status = StatusCode::OK;
    let headers = &mut parts.headers;
    headers.remove(header::RETRY_AFTER);
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(u16::from(status.code)));
    if let Ok(message) = HeaderValue::from_str(&percent_encode(&status.message)) {
        headers.insert("grpc-message", message);
    }
    if let Some(after) = status.pushback {
        let millis = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(millis));
    }
    Response::from_parts(parts, IdemBody::full(bytes::Bytes::new()))
}

/// `grpc-message`'s encoding: bytes outside printable ASCII, and `%`,
/// percent-encoded.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rejection::Rejection;

    #[test]
    fn statuses_that_may_follow_an_effect_are_unknown_and_busy_ones_release() {
        assert_eq!(verdict(b"0"), Verdict::Stored);
        assert_eq!(verdict(b"9"), Verdict::Stored);
        for cut_off in [&b"1"[..], b"2", b"4"] {
            assert_eq!(verdict(cut_off), Verdict::Unknown);
        }
        for busy in [&b"8"[..], b"10", b"12", b"13", b"14", b"15"] {
            assert_eq!(verdict(busy), Verdict::Released);
        }
    }

    fn status_of(rejection: Rejection) -> HeaderMap {
        let response = answer(rejection.into_response().map(IdemBody::full));
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/grpc");
        response.headers().clone()
    }

    #[test]
    fn idem_answers_are_trailers_only_statuses() {
        let busy = status_of(Rejection::InProgress {
            retry_after: Duration::from_millis(250),
        });
        assert_eq!(busy["grpc-status"], "10");
        assert_eq!(busy["grpc-retry-pushback-ms"], "250");
        assert!(busy.get(header::RETRY_AFTER).is_none());
        assert_eq!(status_of(Rejection::Mismatch)["grpc-status"], "9");
        let malformed = status_of(Rejection::KeyMalformed {
            detail: "byte 0x20 at offset 3, 100%".into(),
        });
        assert_eq!(malformed["grpc-status"], "3");
        assert!(
            malformed["grpc-message"]
                .to_str()
                .expect("ascii")
                .ends_with("100%25"),
            "{malformed:?}"
        );
        let down = status_of(Rejection::StoreUnavailable {
            error: "refused".into(),
            executed: false,
        });
        assert_eq!(down["grpc-status"], "14");
        let unknown = status_of(Rejection::OutcomeUnknown {
            detail: "lease ran out".into(),
        });
        assert_eq!(unknown["grpc-status"], "15");
    }

    /// A gRPC frame of `message`.
    fn framed(message: &[u8]) -> Vec<u8> {
        let mut body = vec![0u8];
        body.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
        body.extend_from_slice(message);
        body
    }

    #[test]
    fn the_request_id_is_read_from_its_field_past_the_others() {
        // order = "o-1" (1), cents = 1250 (2, varint), fixed64 (4),
        // request_id = "r-9" (3).
        let mut message = vec![0x0a, 3, b'o', b'-', b'1', 0x10, 0xe2, 0x09];
        message.extend_from_slice(&[0x21, 1, 2, 3, 4, 5, 6, 7, 8]);
        message.extend_from_slice(&[0x1a, 3, b'r', b'-', b'9']);
        let body = framed(&message);
        assert_eq!(request_id(&body, 3), Ok(Some("r-9".to_owned())));
        assert_eq!(request_id(&body, 7), Ok(None));
        assert_eq!(request_id(&framed(&[]), 3), Ok(None));
        let mut compressed = body.clone();
        compressed[0] = 1;
        assert!(request_id(&compressed, 3).is_err_and(|e| e.contains("compressed")));
        assert!(request_id(&body[..body.len() - 1], 3).is_err());
        assert!(request_id(&framed(&[0x1a, 9, b'r']), 3).is_err_and(|e| e.contains("ends")));
        assert!(request_id(&framed(&[0x1a, 2, 0xff, 0xfe]), 3).is_err_and(|e| e.contains("UTF-8")));
        assert!(request_id(&[0, 0], 3).is_err());
    }

    #[test]
    fn grpc_web_is_not_grpc() {
        let with = |t: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
            is_grpc(&headers)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("application/grpc; charset=utf-8"));
        assert!(!with("application/grpc-web"));
        assert!(!with("application/grpc-web-text"));
        assert!(!with("application/json"));
    }

    #[test]
    fn other_responses_pass_unchanged() {
        let response = Response::builder()
            .status(StatusCode::CREATED)
            .body(IdemBody::full(bytes::Bytes::from_static(b"{}")))
            .expect("response");
        assert_eq!(answer(response).status(), StatusCode::CREATED);
    }
}
