//! `application/problem+json` answers (RFC 9457).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::grpc;

/// The `type` URI of the problem named `$slug`: every problem idem
/// answers with (this middleware, the gateway, `idem serve`) shares one
/// base, and the last path segment is the stable name clients branch on.
/// Each is described in the guide's "Problem types" chapter.
#[doc(hidden)]
#[macro_export]
macro_rules! problem_type {
    ($slug:literal) => {
        concat!("https://idem.dev/problems/", $slug)
    };
}

/// The `type` URIs of the problems this middleware answers with; stable,
/// so clients can branch on them.
pub mod types {
    /// The key header is missing where it is required.
    pub const KEY_MISSING: &str = crate::problem_type!("key-missing");
    /// The key header is malformed.
    pub const KEY_MALFORMED: &str = crate::problem_type!("key-malformed");
    /// The key is a UUIDv7 older than the key lifetime.
    pub const KEY_TOO_OLD: &str = crate::problem_type!("key-too-old");
    /// A request with this key is still running.
    pub const IN_PROGRESS: &str = crate::problem_type!("in-progress");
    /// The key was used with a different request.
    pub const MISMATCH: &str = crate::problem_type!("fingerprint-mismatch");
    /// The request body is over the limit.
    pub const BODY_TOO_LARGE: &str = crate::problem_type!("body-too-large");
    /// The request body could not be read or fingerprinted.
    pub const BAD_BODY: &str = crate::problem_type!("bad-body");
    /// The idempotency store could not be reached.
    pub const STORE_UNAVAILABLE: &str = crate::problem_type!("store-unavailable");
    /// The upstream could not be reached; nothing was sent to it.
    pub const UPSTREAM: &str = crate::problem_type!("upstream-unavailable");
    /// The request may have reached the upstream but its response was
    /// lost: the key is kept as failed with an unknown outcome and will not
    /// run the request again.
    pub const OUTCOME_UNKNOWN: &str = crate::problem_type!("outcome-unknown");
    /// The request ran but its response could not be stored.
    pub const NOT_STORED: &str = crate::problem_type!("response-not-stored");
    /// A stored response could not be read back.
    pub const STORED_UNREADABLE: &str = crate::problem_type!("stored-response-unreadable");
}

/// An `application/problem+json` answer under construction: a status, a
/// stable `type` URI, a short title, a detail for people and, for answers
/// worth retrying, a `Retry-After`.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<Duration>,
}

impl Problem {
    /// A problem with this status, `type` URI, title and detail.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// Adds a `Retry-After` header: whole seconds, rounded up, at least one.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The answer. A gRPC caller of the layer gets it as a trailers-only
    /// status instead (DESIGN §8).
    pub fn into_response(self) -> Response<Bytes> {
        let body = serde_json::json!({
            "type": self.kind,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let mut response = Response::new(Bytes::from(body.to_string()));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response.extensions_mut().insert(grpc::Status::new(
            self.kind,
            self.status,
            format!("{}: {}", self.title, self.detail),
            self.retry_after,
        ));
        if let Some(after) = self.retry_after {
            // Whole seconds, rounded up, at least one (RFC 9110 §10.2.3).
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}
