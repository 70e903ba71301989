//! The service on its own (`tower::ServiceExt::oneshot`), over the
//! in-memory store with a manual clock: what it does when the earlier
//! attempt of a key died, when the inner service fails, when a response's
//! head is too large to store, when the store fails after the request ran,
//! and what the inner service is told about its run.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use idem::store::Lease;
use idem::{ManualClock, MemoryStore, StoreError, Timestamp};
use idem_http::{IdempotencyLayer, NotExecuted};
use idem_testkit::doubles::{Double, Hooks};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, ServiceExt};

mod common;
mod dying;

use common::{body, problem, Body};
use dying::die_mid_request;

fn post(key: &str) -> Request<Body> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"amount":1250}"#)))
        .expect("request")
}

type Inner = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

/// Counts its calls; answers 201 saying what it was told of its run.
fn counting(calls: &Arc<AtomicU32>) -> Inner {
    let calls = Arc::clone(calls);
    BoxCloneService::new(service_fn(move |request: Request<Body>| {
        let calls = Arc::clone(&calls);
        async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let ctx = request.extensions().get::<idem::Context>().cloned();
            let body = format!(
                "charge {n} fence {:?} takeover {:?}",
                ctx.as_ref().and_then(idem::Context::fence),
                ctx.as_ref().map(idem::Context::is_takeover)
            );
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from(body)))
                    .expect("response"),
            )
        }
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_is_in_doubt_by_default_and_never_passed_on() {
    let clock = ManualClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let layer = IdempotencyLayer::builder(store).build().expect("layer");
    die_mid_request(&layer, post("order-1"));
    // The dead run's lease (30 s) runs out.
    clock.advance(Duration::from_secs(31));

    let calls = Arc::new(AtomicU32::new(0));
    for _ in 0..2 {
        let response = layer
            .layer(counting(&calls))
            .oneshot(post("order-1"))
            .await
            .expect("answered");
        problem(response, 422, "/outcome-unknown").await;
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "a request whose earlier attempt may have run is not passed on again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_is_passed_on_when_asked_and_the_handler_is_told() {
    let clock = ManualClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let layer = IdempotencyLayer::builder(store)
        .forward_takeovers(true)
        .build()
        .expect("layer");
    die_mid_request(&layer, post("order-2"));
    clock.advance(Duration::from_secs(31));

    let calls = Arc::new(AtomicU32::new(0));
    let response = layer
        .layer(counting(&calls))
        .oneshot(post("order-2"))
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::CREATED);
    let body = body(response).await;
    assert_eq!(
        body, "charge 1 fence Some(2) takeover Some(true)",
        "the second holder runs with a larger fence and knows it took over"
    );
    let replay = layer
        .layer(counting(&calls))
        .oneshot(post("order-2"))
        .await
        .expect("answered");
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inner_service_sees_its_run() {
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let response = layer
        .layer(counting(&calls))
        .oneshot(post("order-3"))
        .await
        .expect("answered");
    let body = body(response).await;
    assert_eq!(body, "charge 1 fence Some(1) takeover Some(false)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inner_error_is_in_doubt_unless_marked_not_executed() {
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let failing = |marked: bool| {
        let calls = Arc::clone(&calls);
        service_fn(move |_: Request<Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let error = std::io::Error::other("timed out waiting for the database");
                Err::<Response<Body>, BoxError>(if marked {
                    NotExecuted::new(error).into()
                } else {
                    error.into()
                })
            }
        })
    };

    // Unmarked: it may have acted; the key is kept (502 now, 422 later)
    // and never runs again.
    for status in [502, 422] {
        let response = layer
            .layer(failing(false))
            .oneshot(post("order-4"))
            .await
            .expect("answered");
        problem(response, status, "/outcome-unknown").await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never called twice");

    // Marked NotExecuted: the key is released and the retry runs.
    for _ in 0..2 {
        let response = layer
            .layer(failing(true))
            .oneshot(post("order-5"))
            .await
            .expect("answered");
        problem(response, 502, "/upstream-unavailable").await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_too_large_to_store_still_reaches_its_client() {
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .max_response_bytes(1024)
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let big_head = {
        let calls = Arc::clone(&calls);
        service_fn(move |_: Request<Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(201)
                        .header("x-trace", "t".repeat(70 * 1024))
                        .body(Full::new(Bytes::from_static(b"created")))
                        .expect("response"),
                )
            }
        })
    };
    let first = layer
        .layer(big_head.clone())
        .oneshot(post("order-6"))
        .await
        .expect("answered");
    assert_eq!(first.status(), StatusCode::CREATED, "its own response");
    assert_eq!(first.headers()["x-trace"].len(), 70 * 1024);
    let body = body(first).await;
    assert_eq!(body, "created");
    let again = layer
        .layer(big_head)
        .oneshot(post("order-6"))
        .await
        .expect("answered");
    problem(again, 422, "/response-not-stored").await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Every `complete` answered with the error its function makes, over the
/// memory store: the store fails after the request ran (a unit test of the
/// layer's answer; the stores themselves are proven against real servers
/// elsewhere).
#[derive(Clone)]
struct FailsToComplete(fn() -> StoreError);

impl Hooks<MemoryStore> for FailsToComplete {
    async fn complete(
        &self,
        _: &MemoryStore,
        _: &Lease,
        _: Bytes,
        _: Duration,
    ) -> Result<(), StoreError> {
        Err((self.0)())
    }
}

fn failing_to_complete(error: fn() -> StoreError) -> Double<MemoryStore, FailsToComplete> {
    Double::new(MemoryStore::new(), FailsToComplete(error))
}

fn unreachable_store() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

fn refusing_store() -> StoreError {
    StoreError::Backend(
        "ValidationException: Item size has exceeded the maximum allowed size".into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fails_after_the_run_says_the_request_ran() {
    let layer = IdempotencyLayer::builder(failing_to_complete(unreachable_store))
        .lease(Duration::from_millis(300))
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let response = layer
        .layer(counting(&calls))
        .oneshot(post("order-7"))
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = body(response).await;
    let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let detail = json["detail"].as_str().expect("detail");
    assert!(detail.contains("was executed"), "{detail}");
    assert!(!detail.contains("nothing was executed"), "{detail}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A store that answers and refuses the response (too large for it,
/// invalid) ends the run failed: the first answer is the one every retry
/// gets, a 422 saying the request ran and its response could not be
/// stored, not a 503 inviting a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_the_store_refuses_is_422_now_and_on_every_retry() {
    let layer = IdempotencyLayer::builder(failing_to_complete(refusing_store))
        .lease(Duration::from_millis(300))
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let service = layer.layer(counting(&calls));
    let first = service
        .clone()
        .oneshot(post("order-8"))
        .await
        .expect("answered");
    assert!(
        first.headers().get("retry-after").is_none(),
        "a retry gets the same answer, so none is invited"
    );
    let detail = problem(first, 422, "/response-not-stored").await;
    assert!(
        detail.contains("was executed") && detail.contains("maximum allowed size"),
        "{detail}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = service.oneshot(post("order-8")).await.expect("answered");
    problem(again, 422, "/response-not-stored").await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "it ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_uuid_v7_key_is_refused_when_asked() {
    let calls = Arc::new(AtomicU32::new(0));
    // Minted 2020-01-01, long past a 24 h retention.
    let old = "016f5e66-e800-7000-8000-000000000000";
    let fresh = uuid_v7_now();
    let checking = IdempotencyLayer::builder(MemoryStore::new())
        .reject_old_uuid_v7(true)
        .build()
        .expect("layer");
    let response = checking
        .layer(counting(&calls))
        .oneshot(post(old))
        .await
        .expect("answered");
    problem(response, 410, "/key-too-old").await;
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    for key in [fresh.as_str(), "not-a-uuid"] {
        let response = checking
            .layer(counting(&calls))
            .oneshot(post(key))
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::CREATED, "{key}");
    }
    // Off by default.
    let plain = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .expect("layer");
    let response = plain
        .layer(counting(&calls))
        .oneshot(post(old))
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::CREATED);
}

fn uuid_v7_now() -> String {
    let ms = Timestamp::now().as_millis();
    let hex = format!("{ms:012x}");
    format!("{}-{}-7000-8000-000000000000", &hex[..8], &hex[8..])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_is_the_verified_principal_not_the_token() {
    #[derive(Clone)]
    struct Account(u64);
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .tenant_principal(|a: &Account| a.0.to_string())
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let as_account = |account: u64, token: &str| {
        let mut request = post("order-8");
        request.extensions_mut().insert(Account(account));
        request
            .headers_mut()
            .insert("authorization", token.parse().expect("header"));
        request
    };
    // A retry with a refreshed token is the same tenant: replayed.
    let first = layer
        .layer(counting(&calls))
        .oneshot(as_account(7, "Bearer old"))
        .await
        .expect("answered");
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = layer
        .layer(counting(&calls))
        .oneshot(as_account(7, "Bearer refreshed"))
        .await
        .expect("answered");
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    // Another account with the same key is another record.
    let other = layer
        .layer(counting(&calls))
        .oneshot(as_account(8, "Bearer old"))
        .await
        .expect("answered");
    assert!(other.headers().get("idempotent-replayed").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Answers 201 after `delay`, counting its calls.
fn slow(calls: &Arc<AtomicU32>, delay: Duration) -> Inner {
    let calls = Arc::clone(calls);
    BoxCloneService::new(service_fn(move |_: Request<Body>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            tokio::time::sleep(delay).await;
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from(format!("charge {n}"))))
                    .expect("response"),
            )
        }
    }))
}

fn prefer(key: &str, preference: &str) -> Request<Body> {
    let mut request = post(key);
    request
        .headers_mut()
        .insert("prefer", preference.parse().expect("header"));
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_that_prefers_to_wait_gets_the_outcome_when_it_is_stored() {
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .max_wait(Duration::from_secs(3))
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let first = tokio::spawn(
        layer
            .layer(slow(&calls, Duration::from_millis(600)))
            .oneshot(post("order-9")),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Without a preference: 409 at once.
    let started = std::time::Instant::now();
    let busy = layer
        .layer(slow(&calls, Duration::ZERO))
        .oneshot(post("order-9"))
        .await
        .expect("answered");
    assert_eq!(busy.status(), StatusCode::CONFLICT);
    assert!(started.elapsed() < Duration::from_millis(300));

    // `Prefer: wait=100` (capped at 3 s): held until the response is
    // stored, then replayed, well before its wait would end.
    let started = std::time::Instant::now();
    let waited = layer
        .layer(slow(&calls, Duration::ZERO))
        .oneshot(prefer("order-9", "respond-async, wait=100"))
        .await
        .expect("answered");
    let took = started.elapsed();
    assert_eq!(waited.status(), StatusCode::CREATED);
    assert_eq!(waited.headers()["idempotent-replayed"], "true");
    assert_eq!(waited.headers()["preference-applied"], "wait=3");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    let body = body(waited).await;
    assert_eq!(body, "charge 1");
    assert_eq!(
        first.await.expect("task").expect("answered").status(),
        StatusCode::CREATED
    );

    // A wait shorter than the run: 409 when it ends.
    let _long = tokio::spawn(
        layer
            .layer(slow(&calls, Duration::from_secs(3)))
            .oneshot(post("order-10")),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let gave_up = layer
        .layer(slow(&calls, Duration::ZERO))
        .oneshot(prefer("order-10", "wait=1"))
        .await
        .expect("answered");
    assert_eq!(gave_up.status(), StatusCode::CONFLICT);
    assert_eq!(gave_up.headers()["preference-applied"], "wait=1");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Answers 201 with a cookie, a date from long ago and a request id.
fn with_cookie() -> Inner {
    BoxCloneService::new(service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .status(201)
                .header("date", "Sun, 06 Nov 1994 08:49:37 GMT")
                .header("set-cookie", "session=abc; HttpOnly")
                .header("x-request-id", "r-1")
                .body(Full::new(Bytes::from_static(b"charged")))
                .expect("response"),
        )
    }))
}

#[tokio::test]
async fn replays_are_dated_now_and_leave_out_the_headers_asked() {
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .replay_drop_headers([HeaderName::from_static("x-request-id")])
        .build()
        .expect("layer");
    let service = layer.layer(with_cookie());
    let first = service
        .clone()
        .oneshot(post("order-9"))
        .await
        .expect("first");
    assert_eq!(first.headers()["set-cookie"], "session=abc; HttpOnly");
    assert_eq!(first.headers()["date"], "Sun, 06 Nov 1994 08:49:37 GMT");
    let replay = service.oneshot(post("order-9")).await.expect("replay");
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert!(replay.headers().get("x-request-id").is_none());
    assert!(
        replay.headers().get("set-cookie").is_none(),
        "not replayed by default"
    );
    let date = replay.headers()["date"].to_str().expect("date");
    let age = httpdate::parse_http_date(date)
        .expect("an HTTP date")
        .elapsed()
        .unwrap_or_default();
    assert!(age < Duration::from_secs(60), "{date}");
    assert_eq!(body(replay).await, "charged");

    // Kept as stored when asked.
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .replay_redate(false)
        .replay_set_cookie(true)
        .build()
        .expect("layer");
    let service = layer.layer(with_cookie());
    service
        .clone()
        .oneshot(post("order-10"))
        .await
        .expect("first");
    let replay = service.oneshot(post("order-10")).await.expect("replay");
    assert_eq!(replay.headers()["date"], "Sun, 06 Nov 1994 08:49:37 GMT");
    assert_eq!(replay.headers()["set-cookie"], "session=abc; HttpOnly");
}
