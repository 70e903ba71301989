//! Keys after the retention: over a store that remembers expired keys, a
//! retry that comes after its record expired is answered 410 `key-expired`
//! (naming how long ago it ran) and never reaches the service, before and
//! after the purge; the same key with another body is a new request.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use idem::{ManualClock, MemoryStore, PurgeExpired};
use idem_http::IdempotencyLayer;
use tower::{service_fn, Layer, ServiceExt};

mod common;

use common::{body, problem, Body};

const DAY: Duration = Duration::from_secs(86_400);

fn charge(key: &str, amount: u32) -> Request<Body> {
    Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(r#"{{"amount":{amount}}}"#))))
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_retention_is_410_and_never_runs_again() {
    let clock = ManualClock::default();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .remember_expired(DAY * 30)
        .build();
    let layer = IdempotencyLayer::builder(store.clone())
        .retention(DAY)
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let service = {
        let calls = Arc::clone(&calls);
        layer.layer(service_fn(move |_: Request<Body>| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from(format!("charge {n}"))))
                        .expect("response"),
                )
            }
        }))
    };
    let first = service.clone().oneshot(charge("order-7", 1250)).await;
    assert_eq!(first.expect("answered").status(), 201);

    clock.advance(DAY * 3);
    let late = service.clone().oneshot(charge("order-7", 1250)).await;
    let detail = problem(late.expect("answered"), 410, "/key-expired").await;
    assert!(detail.contains("about 3 days ago"), "{detail}");

    while store.purge_expired(100).await.expect("purge") > 0 {}
    assert_eq!(store.remembered(), 1, "the purge remembers the key");
    let late = service.clone().oneshot(charge("order-7", 1250)).await;
    problem(late.expect("answered"), 410, "/key-expired").await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the late retries never ran"
    );

    let reused = service.clone().oneshot(charge("order-7", 99)).await;
    let reused = reused.expect("answered");
    assert_eq!(
        reused.status(),
        201,
        "another request under the old key runs"
    );
    assert_eq!(body(reused).await, "charge 2");
}
