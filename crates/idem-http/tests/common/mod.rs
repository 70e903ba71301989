//! What the service tests share.

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use idem_http::IdemBody;

/// The request and response body of the tests' inner services.
pub(crate) type Body = Full<Bytes>;

/// The whole body of a response.
pub(crate) async fn body(response: Response<IdemBody>) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
}

/// The problem's `detail`, after checking its status, its content type and
/// that its type ends with `kind`.
pub(crate) async fn problem(response: Response<IdemBody>, status: u16, kind: &str) -> String {
    assert_eq!(response.status().as_u16(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body = body(response).await;
    let json: serde_json::Value = serde_json::from_slice(&body).expect("problem json");
    assert_eq!(json["status"], status);
    assert!(
        json["type"].as_str().expect("type").ends_with(kind),
        "{json}"
    );
    json["detail"].as_str().expect("detail").to_owned()
}
