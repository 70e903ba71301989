//! The claim API's problem answers (RFC 9457), each with a stable `type`
//! a client can branch on (listed in `openapi.yaml`).

use std::time::Duration;

use http::StatusCode;
use idem::StoreError;
use idem_http::Problem;

/// The request is not what the API takes; `detail` says which field and
/// which rule.
pub const BAD_REQUEST: &str = "https://idem.dev/problems/bad-request";
/// No token, or one that acts for no tenant.
pub const UNAUTHORIZED: &str = "https://idem.dev/problems/unauthorized";
/// No live record for the scope and key.
pub const NOT_FOUND: &str = "https://idem.dev/problems/not-found";
/// The request body is over `--max-request-bytes`.
pub const BODY_TOO_LARGE: &str = "https://idem.dev/problems/body-too-large";
/// The record no longer carries the lease: nothing was written.
pub const LEASE_LOST: &str = "https://idem.dev/problems/lease-lost";
/// The store could not be reached; try again after `Retry-After`.
pub const STORE_UNAVAILABLE: &str = "https://idem.dev/problems/store-unavailable";
/// The store is at its size limit.
pub const STORE_FULL: &str = "https://idem.dev/problems/store-full";
/// The store answered with an error.
pub const STORE_ERROR: &str = "https://idem.dev/problems/store-error";
/// A stored record or result could not be read back.
pub const UNREADABLE: &str = "https://idem.dev/problems/stored-record-unreadable";

pub(crate) fn bad_request(detail: impl Into<String>) -> Problem {
    Problem::new(StatusCode::BAD_REQUEST, BAD_REQUEST, "bad request", detail)
}

pub(crate) fn unauthorized() -> Problem {
    Problem::new(
        StatusCode::UNAUTHORIZED,
        UNAUTHORIZED,
        "unauthorized",
        "send Authorization: Bearer TOKEN with a token from the server's --tokens file",
    )
}

pub(crate) fn not_found(scope: &str, key: &str) -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        NOT_FOUND,
        "no such record",
        format!("no live record for scope {scope:?}, key {key:?} (never claimed, or expired)"),
    )
}

pub(crate) fn no_route(path: &str) -> Problem {
    Problem::new(
        StatusCode::NOT_FOUND,
        NOT_FOUND,
        "no such route",
        format!("{path} is not part of the API (see /openapi.yaml)"),
    )
}

pub(crate) fn wrong_method(method: &http::Method, path: &str) -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        BAD_REQUEST,
        "method not allowed",
        format!("{path} does not take {method} (see /openapi.yaml)"),
    )
}

pub(crate) fn too_large(limit: usize) -> Problem {
    Problem::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        BODY_TOO_LARGE,
        "request body too large",
        format!("the request body is over {limit} bytes (the server's --max-request-bytes)"),
    )
}

pub(crate) fn unreadable(reason: String) -> Problem {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        UNREADABLE,
        "stored record unreadable",
        format!(
            "the stored value {reason}: it was not written through idem serve, \
             or was damaged"
        ),
    )
}

/// A store's refusal or failure, as a problem.
pub(crate) fn store_problem(error: StoreError) -> Problem {
    let chain = idem::error_chain(&error);
    match error {
        StoreError::LeaseLost => Problem::new(
            StatusCode::CONFLICT,
            LEASE_LOST,
            "lease lost",
            "the record no longer carries this lease: its lease ran out and another caller \
             took it over, or it was released, completed, deleted or expired. Nothing was \
             written; stop acting on this claim",
        ),
        StoreError::Unavailable(_) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            STORE_UNAVAILABLE,
            "store unavailable",
            format!("{chain}; whether a write landed is unknown: send it again"),
        )
        .retry_after(Duration::from_secs(1)),
        StoreError::CapacityExceeded { .. } => Problem::new(
            StatusCode::INSUFFICIENT_STORAGE,
            STORE_FULL,
            "store full",
            chain,
        ),
        StoreError::Corrupt { .. } => Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            UNREADABLE,
            "stored record unreadable",
            chain,
        ),
        _ => Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            STORE_ERROR,
            "store error",
            chain,
        ),
    }
}
