//! Every answer the middleware gives in place of the inner service's
//! response: one variant per row of the status table (docs/design.md §8), each
//! knowing its status, problem type, title and `Retry-After`.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Response, StatusCode};

use crate::problem::Problem;
use crate::problem_types as types;

/// The longest `Retry-After` a 409 advises.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long to advise waiting after a store error.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why the middleware answered a covered request itself. Each variant is
/// rendered as `application/problem+json` (RFC 9457) with a stable `type`
/// URI from [`problem_types`](crate::problem_types).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// 400: the key header is required and missing.
    KeyMissing {
        /// The key header's name.
        header: HeaderName,
        /// Where in the body the key is also looked for, if anywhere
        /// (e.g. `the JSON pointer "/id" of its JSON body`).
        body: Option<String>,
    },
    /// 400: the key header is malformed; `detail` names the rule broken.
    KeyMalformed {
        /// Which rule, in words.
        detail: String,
    },
    /// 410: the key is a UUIDv7 older than the retention: a retry this
    /// late may belong to a request whose record has already expired, so
    /// it is refused rather than run again.
    KeyTooOld {
        /// How old the key is, by the time in it.
        age: Duration,
        /// How long keys are remembered.
        retention: Duration,
    },
    /// 413: the request body is over the limit; the key was not used.
    BodyTooLarge {
        /// The body's size, as far as it was read (`"more than N"`).
        size: String,
        /// The limit in bytes.
        limit: usize,
    },
    /// 400: the body could not be read or fingerprinted; the key was not
    /// used.
    BadBody {
        /// What was wrong.
        detail: String,
    },
    /// 400: a webhook's signature does not check out (see
    /// [`Webhook`](crate::Webhook)); nothing was claimed, so the sender's
    /// own signed delivery still runs.
    BadSignature {
        /// What was wrong, without what was expected.
        detail: String,
    },
    /// 409: a request with this key is still running.
    InProgress {
        /// When to try again (capped at one second: most requests finish
        /// well before the other claim's lease would run out).
        retry_after: Duration,
    },
    /// 422: the key was used with a different request.
    Mismatch,
    /// 410: a request with this key ran, and its record has expired; the
    /// store remembers the key ([`idem::horizon`]), so this late retry is
    /// refused rather than run again.
    KeyExpired {
        /// How long ago the key's record ended, at least.
        age: Duration,
    },
    /// 422: an earlier request with this key may have been processed, but
    /// its response was lost (its process died mid-request, or the
    /// upstream's answer never came); the key is kept and will not run
    /// again until an operator releases it.
    OutcomeUnknown {
        /// What happened.
        detail: String,
    },
    /// 502: this request may have reached the upstream but its response
    /// was lost now; the key is kept as unknown (later requests get
    /// [`Rejection::OutcomeUnknown`]).
    LostResponse {
        /// What happened.
        detail: String,
    },
    /// 502: the upstream (inner service) failed before acting on the
    /// request; the key was released, so the request may be retried.
    Upstream {
        /// What happened.
        detail: String,
    },
    /// 422: a request with this key ran but its response could not be
    /// stored (over the size limit, or refused by the store); it will not
    /// run again under this key, and retries get this answer too.
    NotStored {
        /// Why.
        detail: String,
    },
    /// 503: the idempotency store could not be used.
    StoreUnavailable {
        /// What the store said.
        error: String,
        /// Whether the request had already been passed on (the store
        /// failed while its outcome was being recorded).
        executed: bool,
    },
    /// 503: the request ran, but its claim was taken over before its
    /// response was stored.
    LeaseLost,
    /// 500: a stored response could not be read back.
    StoredUnreadable {
        /// What was wrong with it.
        reason: String,
    },
    /// 500: the request's run ended without an answer (the inner service
    /// panicked); its key stays in progress until its lease runs out.
    Internal {
        /// What happened.
        detail: String,
    },
}

impl Rejection {
    /// The status code.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::KeyMissing { .. }
            | Self::KeyMalformed { .. }
            | Self::BadBody { .. }
            | Self::BadSignature { .. } => StatusCode::BAD_REQUEST,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::InProgress { .. } => StatusCode::CONFLICT,
            Self::KeyTooOld { .. } | Self::KeyExpired { .. } => StatusCode::GONE,
            Self::Mismatch | Self::OutcomeUnknown { .. } | Self::NotStored { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            Self::LostResponse { .. } | Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::StoreUnavailable { .. } | Self::LeaseLost => StatusCode::SERVICE_UNAVAILABLE,
            Self::StoredUnreadable { .. } | Self::Internal { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The problem `type` URI.
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::KeyMissing { .. } => types::KEY_MISSING,
            Self::KeyMalformed { .. } => types::KEY_MALFORMED,
            Self::KeyTooOld { .. } => types::KEY_TOO_OLD,
            Self::KeyExpired { .. } => types::KEY_EXPIRED,
            Self::BodyTooLarge { .. } => types::BODY_TOO_LARGE,
            Self::BadBody { .. } => types::BAD_BODY,
            Self::BadSignature { .. } => types::BAD_SIGNATURE,
            Self::InProgress { .. } => types::IN_PROGRESS,
            Self::Mismatch => types::MISMATCH,
            Self::OutcomeUnknown { .. } | Self::LostResponse { .. } => types::OUTCOME_UNKNOWN,
            Self::Upstream { .. } => types::UPSTREAM,
            Self::NotStored { .. } | Self::Internal { .. } => types::NOT_STORED,
            Self::StoreUnavailable { .. } | Self::LeaseLost => types::STORE_UNAVAILABLE,
            Self::StoredUnreadable { .. } => types::STORED_UNREADABLE,
        }
    }

    /// The problem `title`.
    pub fn title(&self) -> &'static str {
        match self {
            Self::KeyMissing { .. } => "Idempotency key missing",
            Self::KeyMalformed { .. } => "Idempotency key malformed",
            Self::KeyTooOld { .. } => "Idempotency key older than its lifetime",
            Self::KeyExpired { .. } => "Idempotency key expired",
            Self::BodyTooLarge { .. } => types::BODY_TOO_LARGE_TITLE,
            Self::BadBody { .. } => "Request body unreadable",
            Self::BadSignature { .. } => "Webhook signature invalid",
            Self::InProgress { .. } => "Request in progress",
            Self::Mismatch => "Key reused with a different request",
            Self::OutcomeUnknown { .. } => "Outcome of this key unknown",
            Self::LostResponse { .. } => "Upstream outcome unknown",
            Self::Upstream { .. } => "Upstream unavailable",
            Self::NotStored { .. } | Self::Internal { .. } => "Response not stored",
            Self::StoreUnavailable { .. } => types::STORE_UNAVAILABLE_TITLE,
            Self::LeaseLost => "Outcome not recorded",
            Self::StoredUnreadable { .. } => "Stored response unreadable",
        }
    }

    /// The problem `detail`: what happened, and what the client may do.
    pub fn detail(&self) -> String {
        match self {
            Self::KeyMissing { header, body: None } => format!(
                "this endpoint requires an {header} header (a unique value per request, e.g. a \
                 UUID)"
            ),
            Self::KeyMissing {
                header,
                body: Some(body),
            } => format!(
                "this endpoint requires an idempotency key: an {header} header, or {body} (a \
                 unique value per request, e.g. a UUID)"
            ),
            Self::KeyMalformed { detail } | Self::BadBody { detail } => detail.clone(),
            Self::BadSignature { detail } => format!(
                "{detail}; the request was refused before its key was used, so a delivery the \
                 sender signed still runs"
            ),
            Self::KeyTooOld { age, retention } => format!(
                "this key is a UUIDv7 minted {}s ago, longer than keys are remembered ({}s): a \
                 request that late cannot be told from a new one, so it is refused rather than \
                 run again; use a new key for a new request",
                age.as_secs(),
                retention.as_secs()
            ),
            Self::KeyExpired { age } => format!(
                "a request with this key was processed about {} ago and its stored response \
                 has since expired: this retry came too late to be answered, and is refused \
                 rather than run again; use a new key for a new request",
                spoken(*age)
            ),
            Self::BodyTooLarge { size, limit } => format!(
                "the request body is {size} bytes; the limit is {limit} bytes. The key was not \
                 used"
            ),
            Self::InProgress { .. } => "a request with this key is still being processed; \
                 retry after the Retry-After delay to get its response"
                .to_owned(),
            Self::Mismatch => "this key was already used with a different request (method, \
                 path, query or body); use a new key for a new request"
                .to_owned(),
            Self::OutcomeUnknown { detail } => format!(
                "an earlier request with this key may have been processed, but its response \
                 was lost ({detail}); it will not run again under this key until an operator \
                 checks the upstream and releases the key"
            ),
            Self::LostResponse { detail } => format!(
                "{detail}; it may have been processed, so the key is kept and will not run it \
                 again: check the upstream, then release the key to allow a retry"
            ),
            Self::Upstream { detail } => {
                format!("{detail}; the key was released, so the request may be retried")
            }
            Self::NotStored { detail } => format!(
                "a request with this key was executed but its response could not be stored \
                 ({detail}); it will not run again under this key"
            ),
            Self::StoreUnavailable {
                error,
                executed: false,
            } => format!("the idempotency store could not be used ({error}); nothing was executed"),
            Self::StoreUnavailable {
                error,
                executed: true,
            } => format!(
                "the request was executed, but its response could not be recorded: the \
                 idempotency store failed ({error}). It will not run again under this key: \
                 retries get 409 while the claim lasts, then an outcome-unknown answer until an \
                 operator releases the key"
            ),
            Self::LeaseLost => "the request ran, but its claim was taken over before the \
                 response was stored; retry to get the stored outcome"
                .to_owned(),
            Self::StoredUnreadable { reason } => {
                format!("the stored response for this key could not be read: {reason}")
            }
            Self::Internal { detail } => format!(
                "the request's run ended without a response ({detail}); the key stays in \
                 progress until its lease runs out, then answers outcome-unknown"
            ),
        }
    }

    /// The `Retry-After` the answer carries, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InProgress { retry_after } => Some((*retry_after).min(MAX_RETRY_AFTER)),
            Self::StoreUnavailable { .. } | Self::LeaseLost => Some(STORE_RETRY_AFTER),
            _ => None,
        }
    }

    /// The answer as a response.
    pub fn into_response(self) -> Response<Bytes> {
        let mut problem = Problem::new(
            self.status(),
            self.problem_type(),
            self.title(),
            self.detail(),
        );
        if let Some(after) = self.retry_after() {
            problem = problem.retry_after(after);
        }
        problem.into_response()
    }
}

/// `age` as a person says it, to the largest whole unit: "3 days",
/// "5 hours", "12 minutes", "40 seconds".
fn spoken(age: Duration) -> String {
    let secs = age.as_secs();
    let (n, unit) = match secs {
        0..=119 => (secs, "second"),
        120..=7_199 => (secs / 60, "minute"),
        7_200..=172_799 => (secs / 3_600, "hour"),
        _ => (secs / 86_400, "day"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status(), self.title(), self.detail())
    }
}

impl std::error::Error for Rejection {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_said_in_their_largest_whole_unit() {
        let said = |secs| spoken(Duration::from_secs(secs));
        assert_eq!(said(1), "1 second");
        assert_eq!(said(119), "119 seconds");
        assert_eq!(said(7_199), "119 minutes");
        assert_eq!(said(86_400), "24 hours");
        assert_eq!(said(3 * 86_400 + 5), "3 days");
    }

    #[test]
    fn every_answer_is_problem_json_with_its_status_and_type() {
        let cases = [
            (Rejection::Mismatch, 422, types::MISMATCH, None),
            (
                Rejection::KeyExpired {
                    age: Duration::from_secs(3 * 86_400),
                },
                410,
                types::KEY_EXPIRED,
                None,
            ),
            (
                Rejection::InProgress {
                    retry_after: Duration::from_secs(30),
                },
                409,
                types::IN_PROGRESS,
                Some("1"),
            ),
            (
                Rejection::StoreUnavailable {
                    error: "down".into(),
                    executed: true,
                },
                503,
                types::STORE_UNAVAILABLE,
                Some("1"),
            ),
        ];
        for (rejection, status, kind, retry_after) in cases {
            let response = rejection.into_response();
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(
                response.headers()[http::header::CONTENT_TYPE],
                "application/problem+json"
            );
            assert_eq!(
                response
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .map(|v| v.to_str().expect("ascii")),
                retry_after
            );
            let body: serde_json::Value =
                serde_json::from_slice(response.body()).expect("problem json");
            assert_eq!(body["type"], kind);
            assert_eq!(body["status"], status);
        }
    }

    #[test]
    fn a_store_failure_says_whether_the_request_ran() {
        let before = Rejection::StoreUnavailable {
            error: "x".into(),
            executed: false,
        };
        let after = Rejection::StoreUnavailable {
            error: "x".into(),
            executed: true,
        };
        assert!(before.detail().contains("nothing was executed"));
        assert!(after.detail().contains("was executed"));
        assert!(!after.detail().contains("nothing was executed"));
    }
}
