//! The `type` URIs of every problem idem answers with — this middleware,
//! the gateway and `idem serve`'s claim API — in one place; stable, so
//! clients can branch on them. The gRPC status of each is in `grpc.rs`;
//! the guide's "Problem types" chapter describes each, and a test checks
//! the two lists agree.
//!
//! The titles of the kinds more than one part answers with are here too,
//! so a client sees the same words whichever part it met.

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

/// The key header is missing where it is required.
pub const KEY_MISSING: &str = crate::problem_type!("key-missing");
/// The key header is malformed.
pub const KEY_MALFORMED: &str = crate::problem_type!("key-malformed");
/// The key is a UUIDv7 older than the key lifetime.
pub const KEY_TOO_OLD: &str = crate::problem_type!("key-too-old");
/// The key's record expired, and the store remembers the key: a late
/// retry.
pub const KEY_EXPIRED: &str = crate::problem_type!("key-expired");
/// A request with this key is still running.
pub const IN_PROGRESS: &str = crate::problem_type!("in-progress");
/// The key was used with a different request.
pub const MISMATCH: &str = crate::problem_type!("fingerprint-mismatch");
/// The request body is over the limit.
pub const BODY_TOO_LARGE: &str = crate::problem_type!("body-too-large");
/// The request body could not be read or fingerprinted.
pub const BAD_BODY: &str = crate::problem_type!("bad-body");
/// A webhook's signature did not check out; the key was not used.
pub const BAD_SIGNATURE: &str = crate::problem_type!("bad-signature");
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

/// `idem serve`: the request is not what the API takes; the detail says
/// which field and which rule.
pub const BAD_REQUEST: &str = crate::problem_type!("bad-request");
/// `idem serve`: no token, or one that acts for no tenant.
pub const UNAUTHORIZED: &str = crate::problem_type!("unauthorized");
/// `idem serve` without `--tokens`: a request not addressed to a loopback
/// name, or a POST that is not JSON (what a web page could send).
pub const FORBIDDEN: &str = crate::problem_type!("forbidden");
/// `idem serve`: no live record for the scope and key, or no such route.
pub const NOT_FOUND: &str = crate::problem_type!("not-found");
/// `idem serve`: the record no longer carries the lease; nothing was
/// written.
pub const LEASE_LOST: &str = crate::problem_type!("lease-lost");
/// `idem serve`: the store is at its size limit.
pub const STORE_FULL: &str = crate::problem_type!("store-full");
/// `idem serve`: the store answered with an error.
pub const STORE_ERROR: &str = crate::problem_type!("store-error");
/// `idem serve`: a stored record or result could not be read back.
pub const RECORD_UNREADABLE: &str = crate::problem_type!("stored-record-unreadable");

/// The title of [`BODY_TOO_LARGE`], wherever it is answered.
pub const BODY_TOO_LARGE_TITLE: &str = "Request body too large";
/// The title of [`STORE_UNAVAILABLE`], wherever it is answered.
pub const STORE_UNAVAILABLE_TITLE: &str = "Idempotency store unavailable";
