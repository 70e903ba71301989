//! A function URL (API Gateway's HTTP API payload) through a real Lambda
//! runtime loop, with `idem_http::IdempotencyLayer` in front of the
//! handler and DynamoDB on moto as the store.

mod common;

use common::{counts, url_event, Function, TIMEOUT};
use serde_json::{json, Value};

#[test]
#[ignore = "the function's process, started by the tests"]
fn function() {
    common::function_main();
}

/// The response's status, a header (names are lower-case in the
/// response) and its body.
fn parts(response: &Value, header: &str) -> (u64, Option<String>, String) {
    (
        response["statusCode"].as_u64().expect("statusCode"),
        response["headers"][header].as_str().map(str::to_owned),
        response["body"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_request_is_replayed_and_a_reused_key_refused() {
    let f = Function::start("http").await;
    let charge = json!({"amount": 5});
    let first = f
        .lambda
        .invoke(&url_event("k-1", &charge), TIMEOUT)
        .await
        .json();
    let (status, replayed, body) = parts(&first, "idempotent-replayed");
    assert_eq!((status, replayed), (201, None));
    assert_eq!(serde_json::from_str::<Value>(&body).expect("JSON"), charge);

    let retry = f
        .lambda
        .invoke(&url_event("k-1", &charge), TIMEOUT)
        .await
        .json();
    let (status, replayed, replayed_body) = parts(&retry, "idempotent-replayed");
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(replayed_body, body);

    let reused = json!({"amount": 500});
    let other = f
        .lambda
        .invoke(&url_event("k-1", &reused), TIMEOUT)
        .await
        .json();
    let (status, content_type, _) = parts(&other, "content-type");
    assert_eq!(
        (status, content_type.as_deref()),
        (422, Some("application/problem+json"))
    );
    assert_eq!(f.effects(), counts([("k-1", 1)]));
}
