//! The status table (docs/design.md §8), row by row, through the service alone
//! (`tower::ServiceExt::oneshot`) over the in-memory store. The gateway's
//! own tests keep what only the proxy does.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use idem::{MemoryStore, Store};
use idem_http::{IdemBody, IdempotencyLayer};
use idem_testkit::DownStore;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

mod common;

use common::{body, problem, Body};
type Inner = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// Answers `POST /charges` with 201 after the delay in `x-delay-ms`,
/// `POST /status/N` with N, and anything else with 200; counts its calls.
fn upstream(calls: &Arc<AtomicU32>) -> Inner {
    let calls = Arc::clone(calls);
    BoxCloneService::new(service_fn(move |request: Request<Body>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let delay = request
                .headers()
                .get("x-delay-ms")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .map_or(Duration::ZERO, Duration::from_millis);
            tokio::time::sleep(delay).await;
            let status = request
                .uri()
                .path()
                .strip_prefix("/status/")
                .and_then(|code| code.parse().ok())
                .unwrap_or(if request.method() == Method::POST {
                    201
                } else {
                    200
                });
            Ok(Response::builder()
                .status(status)
                .header("set-cookie", "a=1")
                .header("link", "</a>; rel=a")
                .header("link", "</b>; rel=b")
                .header("connection", "close")
                .body(Full::new(Bytes::from(format!("run {n}"))))
                .expect("response"))
        }
    }))
}

fn request(method: Method, path: &str, key: Option<&str>, body: &'static str) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request")
}

fn charge(key: Option<&str>) -> Request<Body> {
    request(Method::POST, "/charges", key, r#"{"amount":100}"#)
}

async fn call<S: Store>(
    layer: &IdempotencyLayer<S>,
    calls: &Arc<AtomicU32>,
    request: Request<Body>,
) -> Response<IdemBody> {
    layer
        .layer(upstream(calls))
        .oneshot(request)
        .await
        .expect("answered")
}

fn layer() -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::builder(MemoryStore::new())
        .required(true)
        .max_request_bytes(1024)
        .build()
        .expect("layer")
}

#[tokio::test]
async fn methods_not_covered_pass_through_untouched() {
    let (layer, calls) = (layer(), Arc::new(AtomicU32::new(0)));
    for _ in 0..2 {
        let r = call(&layer, &calls, request(Method::GET, "/read", Some("k"), "")).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("idempotent-replayed").is_none());
        assert!(r.headers().get("idempotency-key-lifetime").is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn missing_and_malformed_keys_are_400_naming_the_rule() {
    let (layer, calls) = (layer(), Arc::new(AtomicU32::new(0)));
    let detail = problem(call(&layer, &calls, charge(None)).await, 400, "key-missing").await;
    assert!(
        detail.contains("requires an idempotency-key header"),
        "{detail}"
    );
    let long = "k".repeat(256);
    for (key, says) in [
        (long.as_str(), "at most 255"),
        ("\"a b\"", "0x20"),
        ("\"open", "no closing quote"),
    ] {
        let response = call(&layer, &calls, charge(Some(key))).await;
        let detail = problem(response, 400, "key-malformed").await;
        assert!(detail.contains(says), "{key}: {detail}");
    }
    let mut twice = charge(Some("a"));
    twice
        .headers_mut()
        .append("idempotency-key", "b".parse().expect("value"));
    let detail = problem(call(&layer, &calls, twice).await, 400, "key-malformed").await;
    assert!(detail.contains("2 times"), "{detail}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_key_is_409_with_retry_after_then_replayed_byte_for_byte() {
    let (layer, calls) = (layer(), Arc::new(AtomicU32::new(0)));
    let slow = {
        let (layer, calls) = (layer.clone(), Arc::clone(&calls));
        tokio::spawn(async move {
            let mut request = charge(Some("slow"));
            request
                .headers_mut()
                .insert("x-delay-ms", "400".parse().expect("value"));
            call(&layer, &calls, request).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = call(&layer, &calls, charge(Some("slow"))).await;
    assert_eq!(busy.headers()["retry-after"], "1");
    problem(busy, 409, "in-progress").await;
    let first = slow.await.expect("task");
    assert_eq!(first.status(), 201);
    assert_eq!(first.headers()["idempotency-key-lifetime"], "86400");
    let replay = call(&layer, &calls, charge(Some("slow"))).await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let links: Vec<_> = replay.headers().get_all("link").iter().collect();
    assert_eq!(
        links,
        ["</a>; rel=a", "</b>; rel=b"],
        "repeated headers kept in order"
    );
    assert!(
        replay.headers().get("set-cookie").is_none(),
        "cookies are not replayed by default"
    );
    assert!(
        replay.headers().get("connection").is_none(),
        "hop-by-hop dropped"
    );
    let (a, b) = (body(first).await, body(replay).await);
    assert_eq!(a, b);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_key_reused_for_another_request_is_422_and_canonical_json_is_the_same() {
    let (layer, calls) = (layer(), Arc::new(AtomicU32::new(0)));
    assert_eq!(call(&layer, &calls, charge(Some("k"))).await.status(), 201);
    let other = request(Method::POST, "/charges", Some("k"), r#"{"amount":999}"#);
    problem(
        call(&layer, &calls, other).await,
        422,
        "fingerprint-mismatch",
    )
    .await;
    let same = request(Method::POST, "/charges", Some("k"), r#"{ "amount" : 100 }"#);
    let same = call(&layer, &calls, same).await;
    assert_eq!(same.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_the_key_stays_unused() {
    let (layer, calls) = (layer(), Arc::new(AtomicU32::new(0)));
    let huge = Request::post("/charges")
        .header("idempotency-key", "big")
        .body(Full::new(Bytes::from(vec![b'x'; 4096])))
        .expect("request");
    let detail = problem(call(&layer, &calls, huge).await, 413, "body-too-large").await;
    assert!(detail.contains("limit is 1024"), "{detail}");
    assert_eq!(
        call(&layer, &calls, charge(Some("big"))).await.status(),
        201
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_5xx_or_retryable_4xx_is_passed_on_and_releases_the_key() {
    let (layer, calls) = (layer(), Arc::new(AtomicU32::new(0)));
    for code in ["503", "429", "409"] {
        let path: &'static str = Box::leak(format!("/status/{code}").into_boxed_str());
        for _ in 0..2 {
            let r = call(
                &layer,
                &calls,
                request(Method::POST, path, Some(code), "{}"),
            )
            .await;
            assert_eq!(r.status().as_str(), code);
            assert!(r.headers().get("idempotent-replayed").is_none());
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 6, "each retry ran");
    // A 4xx that is not retryable is stored like a 2xx.
    for _ in 0..2 {
        let r = call(
            &layer,
            &calls,
            request(Method::POST, "/status/404", Some("nf"), "{}"),
        )
        .await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 7);
}

#[tokio::test]
async fn a_store_that_cannot_be_reached_is_503_fail_closed_or_passed_through_fail_open() {
    let calls = Arc::new(AtomicU32::new(0));
    let closed = IdempotencyLayer::builder(DownStore).build().expect("layer");
    let response = call(&closed, &calls, charge(Some("k"))).await;
    assert_eq!(response.headers()["retry-after"], "1");
    let detail = problem(response, 503, "store-unavailable").await;
    assert!(detail.contains("nothing was executed"), "{detail}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let open = IdempotencyLayer::builder(DownStore)
        .fail_open(true)
        .build()
        .expect("layer");
    assert_eq!(call(&open, &calls, charge(Some("k"))).await.status(), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
