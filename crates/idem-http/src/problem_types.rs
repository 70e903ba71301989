//! The `type` URIs of the problems this middleware answers with; stable,
//! so clients can branch on them. The gRPC status of each is in `grpc.rs`.

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
