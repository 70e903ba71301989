//! Keys whose outcome is unknown, settled by asking the service
//! (`idem_http::reconcile`): on the embedded SQLite store, with an inner
//! service that loses its first response after acting on it, and retries
//! that run at once.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use idem::store::Lease;
use idem::{ManualClock, MemoryStore, Store, StoreError};
use idem_http::reconcile::{Finding, Question};
use idem_http::{IdempotencyLayer, OutcomeUnknown};
use idem_sqlite::SqliteStore;
use idem_testkit::doubles::{Double, Hooks};
use tower::util::BoxCloneService;
use tower::{service_fn, Layer, ServiceExt};

mod common;
mod dying;

use common::{body, problem, Body};
use dying::{die_mid_request, die_when};

type Inner = BoxCloneService<Request<Body>, Response<Body>, Infallible>;

fn post(key: &str) -> Request<Body> {
    Request::post("/charges?currency=eur")
        .header("idempotency-key", key)
        .header("authorization", "Bearer t")
        .body(Full::new(Bytes::from_static(br#"{"amount":1250}"#)))
        .expect("request")
}

/// Acts on every call (counted); the first call's response is lost on the
/// way back (a 502 marked [`OutcomeUnknown`], as the gateway marks it).
fn loses_first(calls: &Arc<AtomicU32>) -> Inner {
    let calls = Arc::clone(calls);
    BoxCloneService::new(service_fn(move |_: Request<Body>| {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut response = Response::builder()
                .status(if n == 1 { 502 } else { 201 })
                .body(Full::new(Bytes::from(format!("charge {n}"))))
                .expect("response");
            if n == 1 {
                response.extensions_mut().insert(OutcomeUnknown);
            }
            Ok(response)
        }
    }))
}

/// The response the service says the first call got.
fn first_charge() -> Response<Bytes> {
    Response::builder()
        .status(201)
        .header("x-charge", "1")
        .body(Bytes::from_static(b"charge 1"))
        .expect("response")
}

fn sqlite() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("store");
    (store, dir)
}

async fn send<S: Store>(
    layer: &IdempotencyLayer<S>,
    inner: Inner,
    key: &str,
) -> Response<idem_http::IdemBody> {
    layer
        .layer(inner)
        .oneshot(post(key))
        .await
        .expect("answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn found_applied_the_retry_gets_the_response_found_and_nothing_runs_again() {
    let (store, _dir) = sqlite();
    let asked: Arc<Mutex<Vec<Question>>> = Arc::default();
    let layer = IdempotencyLayer::builder(store)
        .reconciler({
            let asked = Arc::clone(&asked);
            move |question: Question| {
                asked.lock().expect("lock").push(question);
                async { Finding::Applied(first_charge()) }
            }
        })
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let inner = loses_first(&calls);

    let lost = send(&layer, inner.clone(), "order-1").await;
    assert_eq!(lost.status(), StatusCode::BAD_GATEWAY);
    for _ in 0..2 {
        let retry = send(&layer, inner.clone(), "order-1").await;
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(retry.headers()["x-charge"], "1");
        assert_eq!(body(retry).await, "charge 1");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the request ran once");
    let asked = asked.lock().expect("lock");
    assert_eq!(
        asked.len(),
        1,
        "asked once; then the stored response is replayed"
    );
    assert_eq!(asked[0].id.key().as_str(), "order-1");
    assert_eq!(asked[0].method, Method::POST);
    assert_eq!(asked[0].uri, "/charges?currency=eur");
    assert_eq!(asked[0].headers["authorization"], "Bearer t");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn found_not_applied_the_retry_runs_and_is_stored() {
    let (store, _dir) = sqlite();
    let layer = IdempotencyLayer::builder(store)
        .reconciler(|_: Question| async { Finding::NotApplied })
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let inner = loses_first(&calls);

    send(&layer, inner.clone(), "order-2").await;
    let retry = send(&layer, inner.clone(), "order-2").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(body(retry).await, "charge 2");
    let replay = send(&layer, inner.clone(), "order-2").await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(body(replay).await, "charge 2");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_slow_or_oversized_findings_leave_the_key_for_a_person() {
    let (store, _dir) = sqlite();
    let n = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::builder(store)
        .max_response_bytes(1024)
        .reconciler({
            let n = Arc::clone(&n);
            move |_: Question| {
                let n = n.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 => Finding::Unknown("the ledger is down".into()),
                        1 => {
                            tokio::time::sleep(Duration::from_secs(5)).await;
                            Finding::NotApplied
                        }
                        _ => Finding::Applied(Response::new(Bytes::from(vec![b'x'; 200_000]))),
                    }
                }
            }
        })
        .reconcile_limits(Duration::from_millis(200), 4)
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let inner = loses_first(&calls);

    send(&layer, inner.clone(), "order-3").await;
    for _ in 0..3 {
        problem(
            send(&layer, inner.clone(), "order-3").await,
            422,
            "/outcome-unknown",
        )
        .await;
    }
    assert_eq!(n.load(Ordering::SeqCst), 3, "each retry asked");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "and none ran the request again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_reconciling_at_once_settle_the_key_once() {
    for (finding, runs) in [("applied", 1), ("not-applied", 2)] {
        let (store, _dir) = sqlite();
        let layer = IdempotencyLayer::builder(store)
            .reconciler(move |_: Question| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if finding == "applied" {
                    Finding::Applied(first_charge())
                } else {
                    Finding::NotApplied
                }
            })
            .default_wait(Duration::from_secs(5))
            .build()
            .expect("layer");
        let calls = Arc::new(AtomicU32::new(0));
        let inner = loses_first(&calls);
        send(&layer, inner.clone(), "order-4").await;

        let retries: Vec<_> = (0..16)
            .map(|_| {
                let (layer, inner) = (layer.clone(), inner.clone());
                tokio::spawn(async move {
                    let response = send(&layer, inner.clone(), "order-4").await;
                    (response.status(), body(response).await)
                })
            })
            .collect();
        let mut bodies = std::collections::BTreeSet::new();
        for retry in retries {
            let (status, body) = retry.await.expect("retry");
            assert_eq!(status, StatusCode::CREATED, "{finding}: {body:?}");
            bodies.insert(body);
        }
        assert_eq!(calls.load(Ordering::SeqCst), runs, "{finding}");
        assert_eq!(
            bodies.len(),
            1,
            "{finding}: every retry got the same response"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_process_died_is_settled_too() {
    let clock = ManualClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let layer = IdempotencyLayer::builder(store)
        .reconciler(|_: Question| async { Finding::Applied(first_charge()) })
        .build()
        .expect("layer");
    // The first request's process dies inside the inner service.
    die_mid_request(&layer, post("order-5"));
    clock.advance(Duration::from_secs(31));

    let calls = Arc::new(AtomicU32::new(0));
    let inner = loses_first(&calls);
    // The retry takes the dead run's claim over, marks it in doubt and
    // has it settled at once.
    let retry = send(&layer, inner.clone(), "order-5").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(body(retry).await, "charge 1");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing ran again");
}

/// A store whose completions hang (the process dies in them) while
/// `dying` is set, saying so on `reached`.
#[derive(Clone, Default)]
struct DiesCompleting {
    dying: Arc<std::sync::atomic::AtomicBool>,
    reached: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>>,
}

impl Hooks<MemoryStore<ManualClock>> for DiesCompleting {
    async fn complete(
        &self,
        inner: &MemoryStore<ManualClock>,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if self.dying.load(Ordering::SeqCst) {
            if let Some(reached) = self.reached.lock().expect("lock").take() {
                let _ = reached.send(());
            }
            std::future::pending::<()>().await;
        }
        inner.complete(lease, response, retention).await
    }
}

/// A key settled applied whose next attempt died before storing the
/// outcome found: the attempt that takes over stores and replays it,
/// rather than finding the key in doubt again with nothing left to settle
/// (on the old code: 422 for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_died_storing_a_settled_outcome_is_taken_over_with_it() {
    let clock = ManualClock::default();
    let hooks = DiesCompleting::default();
    let store = Double::new(
        MemoryStore::builder().clock(clock.clone()).build(),
        hooks.clone(),
    );
    let layer = IdempotencyLayer::builder(store)
        .reconciler(|_: Question| async { Finding::Applied(first_charge()) })
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let inner = loses_first(&calls);
    send(&layer, inner.clone(), "order-6").await;

    // The retry is settled applied; its process dies storing the outcome.
    hooks.dying.store(true, Ordering::SeqCst);
    let (reached, inside) = tokio::sync::oneshot::channel();
    *hooks.reached.lock().expect("lock") = Some(reached);
    let (doomed, doomed_inner) = (layer.clone(), inner.clone());
    die_when(
        async move { send(&doomed, doomed_inner, "order-6").await },
        inside,
    );
    hooks.dying.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(31));

    let retry = send(&layer, inner.clone(), "order-6").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(body(retry).await, "charge 1");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "nothing ran again");
}

/// Acts on every call (counted) and loses every response.
fn loses_all(calls: &Arc<AtomicU32>) -> Inner {
    let calls = Arc::clone(calls);
    BoxCloneService::new(service_fn(move |_: Request<Body>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut response = Response::builder()
                .status(502)
                .body(Full::new(Bytes::from_static(b"lost")))
                .expect("response");
            response.extensions_mut().insert(OutcomeUnknown);
            Ok(response)
        }
    }))
}

/// Two retries ask at once; the first to hear "not applied" runs the
/// request, which loses its answer again. The other's finding, about the
/// first attempt, arrives after: it settles nothing (on a mark without
/// its attempt it released the second attempt's key, and the request ran
/// a third time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_finding_about_an_earlier_attempt_settles_nothing() {
    let (store, _dir) = sqlite();
    let (asked, first_asked) = tokio::sync::oneshot::channel::<()>();
    let (answer, answered) = tokio::sync::oneshot::channel::<()>();
    let first = Arc::new(Mutex::new(Some((asked, answered))));
    let layer = IdempotencyLayer::builder(store)
        .reconciler(move |_: Question| {
            let first = first.lock().expect("lock").take();
            async move {
                if let Some((asked, answered)) = first {
                    let _ = asked.send(());
                    let _ = answered.await;
                }
                Finding::NotApplied
            }
        })
        .build()
        .expect("layer");
    let calls = Arc::new(AtomicU32::new(0));
    let inner = loses_all(&calls);
    send(&layer, inner.clone(), "order-7").await;

    let slow = {
        let (layer, inner) = (layer.clone(), inner.clone());
        tokio::spawn(async move { send(&layer, inner, "order-7").await })
    };
    first_asked.await.expect("the slow retry asked");
    let quick = send(&layer, inner.clone(), "order-7").await;
    assert_eq!(
        quick.status(),
        StatusCode::BAD_GATEWAY,
        "ran again, lost again"
    );
    answer.send(()).expect("answered");
    let late = slow.await.expect("the slow retry");
    problem(late, 422, "/outcome-unknown").await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
