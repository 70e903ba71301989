//! The layer inside an axum application, over the embedded store, with a
//! real client on loopback: per-route settings and route-template scopes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::Router;
use idem_http::IdempotencyLayer;
use idem_sqlite::SqliteStore;

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_route_layers_and_route_template_scopes() {
    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    let runs = Arc::new(AtomicU64::new(0));
    let required = IdempotencyLayer::builder(store.clone())
        .required(true)
        .build()
        .expect("layer");
    let optional = IdempotencyLayer::builder(store).build().expect("layer");
    let app = Router::new()
        .route(
            "/charges",
            post(|State(runs): State<Arc<AtomicU64>>| async move {
                format!("charge {}", runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .route_layer(required),
        )
        .route(
            "/orders/{id}/ship",
            post(
                |State(runs): State<Arc<AtomicU64>>, Path(id): Path<u32>| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    format!("shipped {id}")
                },
            )
            .route_layer(optional),
        )
        .with_state(Arc::clone(&runs));
    let url = serve(app).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let send = |path: &str, key: Option<&str>| {
        let mut request = client.post(format!("{url}{path}"));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send()
    };

    // Required on /charges ...
    assert_eq!(send("/charges", None).await.expect("sent").status(), 400);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let a = send("/charges", Some("c1")).await.expect("sent");
    assert_eq!(a.text().await.expect("body"), "charge 1");
    let b = send("/charges", Some("c1")).await.expect("sent");
    assert_eq!(b.headers()["idempotent-replayed"], "true");
    assert_eq!(b.text().await.expect("body"), "charge 1");
    // ... optional on /orders.
    assert_eq!(
        send("/orders/1/ship", None).await.expect("sent").status(),
        200
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // One key used for two orders. With the route template as the scope
    // (`axum` feature) both requests share the scope `POST /orders/{id}/ship`
    // and the second, for another order, is a different request: 422.
    // Scoped by path instead, they are two records and both run.
    let first = send("/orders/7/ship", Some("o1")).await.expect("sent");
    assert_eq!(first.text().await.expect("body"), "shipped 7");
    let second = send("/orders/8/ship", Some("o1")).await.expect("sent");
    if cfg!(feature = "axum") {
        assert_eq!(second.status(), 422);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    } else {
        assert_eq!(second.text().await.expect("body"), "shipped 8");
        assert_eq!(runs.load(Ordering::SeqCst), 4);
    }
}

/// A handler behind the layer is not cut off when its client disconnects:
/// it finishes, its response is stored, and the retry gets it. It reads
/// its run's context (fence, takeover) from the request's extensions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_finishes_when_its_client_disconnects() {
    use axum::Extension;
    use tokio::io::AsyncWriteExt;

    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    let runs = Arc::new(AtomicU64::new(0));
    // A short lease: a handler cut off with the connection would be taken
    // over, and run again, by a retry two seconds later.
    let layer = IdempotencyLayer::builder(store)
        .lease(std::time::Duration::from_secs(2))
        .build()
        .expect("layer");
    let app =
        Router::new()
            .route(
                "/charges",
                post(
                    |State(runs): State<Arc<AtomicU64>>,
                     Extension(run): Extension<idem::Context>| async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        format!(
                            "charge {n} fence {:?} takeover {}",
                            run.fence(),
                            run.is_takeover()
                        )
                    },
                )
                .route_layer(layer.clone()),
            )
            .with_state(Arc::clone(&runs));
    let url = serve(app).await;

    let addr = url.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    socket
        .write_all(
            format!(
                "POST /charges HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: gone\r\n\
                 content-length: 0\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("sent");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(socket);

    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let retry = loop {
        let response = client
            .post(format!("{url}/charges"))
            .header("idempotency-key", "gone")
            .send()
            .await
            .expect("sent");
        if response.status() != 409 {
            break response;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(
        retry.text().await.expect("body"),
        "charge 1 fence Some(1) takeover false"
    );
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    let late = client
        .post(format!("{url}/charges"))
        .header("idempotency-key", "gone")
        .send()
        .await
        .expect("sent");
    assert_eq!(late.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    layer.drain().await;
    assert_eq!(layer.running(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_sends_through_the_outbox_once_per_key() {
    use axum::http::StatusCode;
    use axum::Extension;
    use idem::outbox::{MemorySender, Message};

    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    let sent = MemorySender::new();
    let layer = IdempotencyLayer::builder(store)
        .outbox(sent.clone())
        .build()
        .expect("layer");
    let app = Router::new().route(
        "/charges",
        post(
            |Extension(run): Extension<idem::Context>, body: String| async move {
                run.send(Message::new("charges", body.clone()))
                    .expect("kept with the response");
                // A 5xx is not stored: nothing it sent is sent.
                if body == "fail" {
                    return (StatusCode::SERVICE_UNAVAILABLE, "try again");
                }
                (StatusCode::CREATED, "charged")
            },
        )
        .route_layer(layer),
    );
    let url = serve(app).await;
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let post = |key: &'static str, body: &'static str| {
        client
            .post(format!("{url}/charges"))
            .header("idempotency-key", key)
            .body(body)
            .send()
    };
    for attempt in 0..3 {
        let response = post("charge-1", "1250 EUR").await.expect("answered");
        assert_eq!(response.status(), 201);
        let replayed = response.headers().get("idempotent-replayed").is_some();
        assert_eq!(replayed, attempt > 0, "attempt {attempt}");
    }
    let failed = post("charge-2", "fail").await.expect("answered");
    assert_eq!(failed.status(), 503);
    let messages = sent.messages();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(messages[0].payload().as_ref(), b"1250 EUR");
    assert_eq!(messages[0].destination(), "charges");
}
