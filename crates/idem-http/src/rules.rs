//! What the layer's settings are made of: the hooks that read a request
//! head, what a fingerprint covers, and which statuses are stored.

use std::sync::Arc;

use http::request::Parts;
use http::StatusCode;
use idem::Fingerprint;

/// A function of the request head (tenant, route).
pub(crate) type Hook<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;

/// A custom fingerprint of the request head and body.
pub type FingerprintHook = Arc<dyn Fn(&Parts, &[u8]) -> Result<Fingerprint, String> + Send + Sync>;

/// What the fingerprint of a request covers. A key reused with a different
/// fingerprint gets 422.
#[derive(Clone)]
#[non_exhaustive]
pub enum FingerprintRule {
    /// Method, path, query and body (default). A JSON body (by
    /// `Content-Type`) is canonicalised first, so key order and whitespace
    /// do not matter; any other body is taken byte for byte.
    Request,
    /// Method and path, plus only these JSON-pointer fields of the body
    /// (`/amount`, `/customer/id`). A body that is not JSON is refused
    /// with 400.
    JsonFields(Vec<String>),
    /// Your own digest of the request head and body; an `Err` is answered
    /// with 400 and the message as the detail.
    Custom(FingerprintHook),
    /// No fingerprint: any request under a used key gets the stored answer.
    Off,
}

impl std::fmt::Debug for FingerprintRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Request => f.write_str("Request"),
            Self::JsonFields(fields) => f.debug_tuple("JsonFields").field(fields).finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
            Self::Off => f.write_str("Off"),
        }
    }
}

/// Which statuses are stored by default: 2xx, and 4xx except 408, 409,
/// 425 and 429 (the client may rightly retry those). Anything else
/// releases the key, so a retry runs again.
pub fn default_stored(status: StatusCode) -> bool {
    status.is_success()
        || (status.is_client_error() && !matches!(status.as_u16(), 408 | 409 | 425 | 429))
}
