//! `application/problem+json` answers (RFC 9457).

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::grpc;

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
    /// status instead (docs/design.md §8).
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
