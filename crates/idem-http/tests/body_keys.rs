//! Keys read from the JSON body (`key_in_body`), in an axum application
//! over the embedded store, with a real client on loopback: a sender that
//! puts its event id in the body (Stripe's events, MCP tool calls) and one
//! that sends no id at all but whose chosen fields identify the request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::routing::post;
use axum::Router;
use idem::derive::json::JsonKey;
use idem_http::{FingerprintRule, IdempotencyLayer, Webhook, WebhookKind};
use idem_sqlite::SqliteStore;

/// Serves `layer` over a handler counting its runs; the base URL and the
/// count.
async fn serve(layer: IdempotencyLayer<SqliteStore>) -> (String, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route(
            "/events",
            post(|State(runs): State<Arc<AtomicU64>>| async move {
                // Long enough that concurrent duplicates overlap the run.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                format!("handled {}", runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .route_layer(layer),
        )
        .with_state(Arc::clone(&runs));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/events", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, runs)
}

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    (dir, store)
}

/// Served with keys from the body's `/id`, required or not.
async fn keyed_by_id(required: bool) -> (tempfile::TempDir, String, Arc<AtomicU64>) {
    let (dir, store) = store();
    let layer = IdempotencyLayer::builder(store)
        .required(required)
        .key_in_body(JsonKey::Pointer("/id".into()))
        .build()
        .expect("layer");
    let (url, runs) = serve(layer).await;
    (dir, url, runs)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

async fn send(url: &str, body: &str, key: Option<&str>) -> (u16, String) {
    let mut request = client()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.expect("sent");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_keyed_by_a_body_field_run_once() {
    let (_dir, url, runs) = keyed_by_id(true).await;
    let event = r#"{"id":"evt_1","type":"charge.succeeded","data":{"amount":100}}"#;

    let sends = (0..8).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { send(&url, event, None).await })
    });
    let mut handled = 0;
    for send in sends {
        let (status, body) = send.await.expect("joined");
        // A duplicate arriving while the first runs waits for it or is
        // told to retry; none runs the handler again.
        assert!(matches!(status, 200 | 409), "{status} {body}");
        if status == 200 {
            assert_eq!(body, "handled 1");
            handled += 1;
        }
    }
    assert!(handled >= 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run per event id");

    // A later duplicate is a replay; another event runs.
    assert_eq!(send(&url, event, None).await, (200, "handled 1".into()));
    let other = r#"{"id":"evt_2","type":"charge.succeeded","data":{"amount":100}}"#;
    assert_eq!(send(&url, other, None).await, (200, "handled 2".into()));
    // The header still wins over the body.
    assert_eq!(
        send(&url, event, Some("from-header")).await,
        (200, "handled 3".into())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_without_the_key_is_refused_when_keys_are_required() {
    let (_dir, url, runs) = keyed_by_id(true).await;

    let (status, body) = send(&url, r#"{"type":"ping"}"#, None).await;
    assert_eq!(status, 400);
    assert!(
        body.contains(r#"an idempotency-key header, or the JSON pointer \"/id\" of its JSON body"#),
        "{body}"
    );
    let (status, body) = send(&url, "not json", None).await;
    assert_eq!(status, 400);
    assert!(body.contains("the document is not JSON"), "{body}");
    // Present but not a key: refused, never replaced or run.
    for bad in [r#"{"id":{"nested":1}}"#, r#"{"id":"has space"}"#] {
        let (status, body) = send(&url, bad, None).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("key-malformed"), "{body}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_body_key_lets_keyless_bodies_through_unguarded() {
    let (_dir, url, runs) = keyed_by_id(false).await;
    for body in [r#"{"type":"ping"}"#, r#"{"type":"ping"}"#, "plain text"] {
        assert_eq!(send(&url, body, None).await.0, 200);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "no key, no guard");
    let (status, _) = send(&url, r#"{"id":1.5}"#, None).await;
    assert_eq!(status, 400, "a key that is there but wrong is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_a_hash_of_chosen_fields_catches_a_resend_with_a_new_timestamp() {
    let (_dir, store) = store();
    let fields = vec!["/account".to_owned(), "/amount".to_owned()];
    let layer = IdempotencyLayer::builder(store)
        .required(true)
        .key_in_body(JsonKey::Fields(fields.clone()))
        .fingerprint(FingerprintRule::JsonFields(fields))
        .build()
        .expect("layer");
    let (url, runs) = serve(layer).await;

    let first = r#"{"account":"acct_1","amount":500,"sent_at":"10:00:00"}"#;
    let resent = r#"{ "sent_at": "10:00:05", "amount": 500, "account": "acct_1" }"#;
    assert_eq!(send(&url, first, None).await, (200, "handled 1".into()));
    assert_eq!(send(&url, resent, None).await, (200, "handled 1".into()));
    let another = r#"{"account":"acct_1","amount":501,"sent_at":"10:00:09"}"#;
    assert_eq!(send(&url, another, None).await, (200, "handled 2".into()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_verified_and_keyed_by_what_was_signed_whatever_the_other_settings() {
    // GitHub's documented example: this secret signs this body so.
    let secret = "It's a Secret to Everybody";
    let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let (_dir, store) = store();
    let layer = IdempotencyLayer::builder(store)
        .webhook(Webhook::new(WebhookKind::GitHub, secret).expect("secret"))
        // Settings that would let an unsigned request through, or key it
        // by a header a client chooses, are not the webhook's.
        .required(false)
        .header(http::HeaderName::from_static("x-github-delivery"))
        .build()
        .expect("layer");
    let (url, runs) = serve(layer).await;
    let deliver = |delivery: Option<&'static str>, signature: Option<&'static str>| {
        let mut request = client().post(&url).body("Hello, World!");
        if let Some(delivery) = delivery {
            request = request.header("x-github-delivery", delivery);
        }
        if let Some(signature) = signature {
            request = request.header("x-hub-signature-256", signature);
        }
        request.send()
    };
    for delivery in [Some("d-1"), None] {
        let unsigned = deliver(delivery, None).await.expect("sent");
        assert_eq!(unsigned.status(), 400, "{delivery:?}");
        let body = unsigned.text().await.expect("body");
        assert!(body.contains("bad-signature"), "{body}");
    }
    let signed = deliver(Some("d-1"), Some(signature)).await.expect("sent");
    assert_eq!(signed.status(), 200);
    assert_eq!(signed.text().await.expect("body"), "handled 1");
    // The same signed body under another (unsigned) delivery id.
    let again = deliver(Some("d-2"), Some(signature)).await.expect("sent");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn an_unusable_body_key_is_refused_when_the_layer_is_built() {
    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    let error = IdempotencyLayer::builder(store)
        .key_in_body(JsonKey::Pointer("id".into()))
        .build()
        .expect_err("refused");
    assert_eq!(
        error.to_string(),
        "JSON pointer \"id\" is not a usable key source: a field is not a JSON pointer (rule: \
         empty, or starting with '/')"
    );
}

#[test]
fn mcp_replays_cannot_be_kept_by_reference_because_they_are_rewritten() {
    let (_dir, store) = store();
    let error = IdempotencyLayer::builder(store)
        .mcp(idem_http::MCP_KEY_ARGUMENT)
        .keep_rules(idem_http::KeepRules::parse("reference").expect("policy"))
        .build()
        .expect_err("refused");
    assert!(
        error.to_string().contains("cannot be kept by reference"),
        "{error}"
    );
}
