//! The claim API's problem answers (RFC 9457), each with a stable `type`
//! a client can branch on (listed in `openapi.yaml`), from idem's one
//! vocabulary ([`idem_http::problem_types`]).

use std::time::Duration;

use http::StatusCode;
use idem::StoreError;
use idem_http::Problem;

pub use idem_http::problem_types::{
    BAD_REQUEST, BODY_TOO_LARGE, FORBIDDEN, LEASE_LOST, NOT_FOUND, RECORD_UNREADABLE as UNREADABLE,
    STORE_ERROR, STORE_FULL, STORE_UNAVAILABLE, UNAUTHORIZED,
};
use idem_http::problem_types::{BODY_TOO_LARGE_TITLE, STORE_UNAVAILABLE_TITLE};

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

pub(crate) fn not_loopback(host: &str) -> Problem {
    Problem::new(
        StatusCode::FORBIDDEN,
        FORBIDDEN,
        "not addressed to a loopback name",
        format!(
            "without --tokens, idem serve answers only requests whose Host is a loopback name \
             (localhost, 127.0.0.1, [::1]); {host:?} is not one, as when a web page reaches \
             this port through a name of its own (DNS rebinding)"
        ),
    )
}

pub(crate) fn not_json() -> Problem {
    Problem::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        FORBIDDEN,
        "not JSON",
        "without --tokens, idem serve takes only bodies sent as Content-Type: \
         application/json (which a web page cannot send to another origin without asking)",
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
        BODY_TOO_LARGE_TITLE,
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
            STORE_UNAVAILABLE_TITLE,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use idem_http::problem_types as layer;

    /// Every problem type idem answers with is described in the guide's
    /// "Problem types" chapter, and the chapter describes no other.
    #[test]
    fn every_problem_type_is_documented_and_no_other() {
        let chapter = include_str!("../../../../docs/guide/src/problems.md");
        let documented: BTreeSet<&str> = chapter
            .lines()
            .filter_map(|l| l.strip_prefix("### "))
            .collect();
        let answered: BTreeSet<&str> = [
            layer::KEY_MISSING,
            layer::KEY_MALFORMED,
            layer::KEY_TOO_OLD,
            layer::KEY_EXPIRED,
            layer::IN_PROGRESS,
            layer::MISMATCH,
            layer::BODY_TOO_LARGE,
            layer::BAD_BODY,
            layer::BAD_SIGNATURE,
            layer::STORE_UNAVAILABLE,
            layer::UPSTREAM,
            layer::OUTCOME_UNKNOWN,
            layer::NOT_STORED,
            layer::STORED_UNREADABLE,
            layer::BAD_REQUEST,
            layer::UNAUTHORIZED,
            layer::FORBIDDEN,
            layer::NOT_FOUND,
            layer::LEASE_LOST,
            layer::STORE_FULL,
            layer::STORE_ERROR,
            layer::RECORD_UNREADABLE,
        ]
        .iter()
        .map(|uri| {
            uri.strip_prefix(idem_http::problem_type!(""))
                .expect("one base")
        })
        .collect();
        assert_eq!(documented, answered);
    }
}
