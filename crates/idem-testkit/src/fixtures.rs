//! Stored payloads in the layouts earlier builds wrote (`fixtures/`):
//! every store must hand them back byte for byte, and every build must
//! read them.

/// An idem-http response in layout 0 (before trailers): 201, headers
/// `content-type: application/json`, `location: /orders/7`, `set-cookie:
/// a=1`, `set-cookie: b=2`, body [`HTTP_RESPONSE_BODY`].
pub const HTTP_RESPONSE_LAYOUT0: &[u8] = include_bytes!("../fixtures/http-response-layout0.bin");

/// The same response in layout 1, with trailers `x-checksum: c0ffee` and
/// `x-checksum: again`.
pub const HTTP_RESPONSE_LAYOUT1: &[u8] = include_bytes!("../fixtures/http-response-layout1.bin");

/// The body of both HTTP fixtures.
pub const HTTP_RESPONSE_BODY: &[u8] = br#"{"id":7,"status":"charged"}"#;

/// A response stored by the executor's JSON codec.
pub const JSON_RESPONSE: &[u8] = include_bytes!("../fixtures/json-response.bin");

/// The JSON inside [`JSON_RESPONSE`].
pub const JSON_RESPONSE_VALUE: &str = r#"{"charged":4200,"currency":"EUR"}"#;

/// A step result as every build before sealing journaled it: bare JSON.
pub const STEP_RESULT_BARE_JSON: &[u8] = include_bytes!("../fixtures/step-result-bare-json.bin");

/// Every stored-response fixture, named.
pub const RESPONSES: [(&str, &[u8]); 3] = [
    ("http-response-layout0", HTTP_RESPONSE_LAYOUT0),
    ("http-response-layout1", HTTP_RESPONSE_LAYOUT1),
    ("json-response", JSON_RESPONSE),
];
