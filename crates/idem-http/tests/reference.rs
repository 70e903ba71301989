//! Bodies kept by reference through the layer on its own: a gRPC answer
//! whose trailers carry an error after its messages is not stored (the
//! key is released, its client still gets it whole), and one that ends
//! well replays from its blob with its trailers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use idem::blob::{Blobs, DirBlobs};
use idem::MemoryStore;
use idem_http::{IdemBody, IdempotencyLayer, ReplayPolicy};
use tower::{service_fn, Layer, ServiceExt};

/// A gRPC answer of 100 KiB of messages, then `grpc-status: status`.
fn grpc_service(
    calls: &Arc<AtomicU32>,
    status: &'static str,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<IdemBody>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    let calls = Arc::clone(calls);
    service_fn(move |_: Request<Full<Bytes>>| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static(status));
            let body = IdemBody::full_with_trailers(Bytes::from(vec![7u8; 100 * 1024]), trailers);
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "application/grpc")
                    .body(body)
                    .expect("response"),
            )
        }
    })
}

fn call(key: &str) -> Request<Full<Bytes>> {
    Request::post("/shop.Orders/Create")
        .header("idempotency-key", key)
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .expect("request")
}

async fn whole(response: Response<IdemBody>) -> (Bytes, Option<HeaderMap>) {
    let collected = response.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned();
    (collected.to_bytes(), trailers)
}

fn layer(dir: &tempfile::TempDir) -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::builder(MemoryStore::new())
        .keep(ReplayPolicy::Reference { threshold: 1024 })
        .blobs(Blobs::new(DirBlobs::open(dir.path()).expect("dir")))
        .build()
        .expect("layer")
}

#[tokio::test]
async fn a_grpc_error_after_the_messages_is_not_stored_and_its_client_gets_it_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let calls = Arc::new(AtomicU32::new(0));
    let service = layer(&dir).layer(grpc_service(&calls, "14"));
    for attempt in 1..=2 {
        let response = service
            .clone()
            .oneshot(call("unavailable"))
            .await
            .expect("answer");
        assert!(response.headers().get("idempotent-replayed").is_none());
        let (body, trailers) = whole(response).await;
        assert_eq!(body.len(), 100 * 1024);
        assert_eq!(trailers.expect("trailers")["grpc-status"], "14");
        assert_eq!(calls.load(Ordering::SeqCst), attempt, "released: run again");
    }
}

#[tokio::test]
async fn a_grpc_answer_that_ends_well_replays_from_its_blob_with_its_trailers() {
    let dir = tempfile::tempdir().expect("dir");
    let calls = Arc::new(AtomicU32::new(0));
    let service = layer(&dir).layer(grpc_service(&calls, "0"));
    let first = whole(service.clone().oneshot(call("ok")).await.expect("answer")).await;
    let again = service.clone().oneshot(call("ok")).await.expect("answer");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(whole(again).await, first);
    assert_eq!(first.1.expect("trailers")["grpc-status"], "0");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
