//! A process that dies mid-request, for the tests of what the next
//! attempt finds: the work runs in a runtime of its own, which is shut
//! down with the work still inside once it says it got there (its
//! heartbeat and everything with it stop, as in a crash).

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use idem::Store;
use idem_http::IdempotencyLayer;
use tokio::sync::oneshot;
use tower::{service_fn, Layer, ServiceExt};

use crate::common::Body;

/// Runs `work` in a runtime of its own until `reached` fires, then shuts
/// that runtime down with `work` still inside.
pub(crate) fn die_when<F>(work: F, reached: oneshot::Receiver<()>)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            tokio::spawn(work);
            reached.await.expect("the doomed work got where it dies");
        });
        runtime.shutdown_background();
    })
    .join()
    .expect("the doomed runtime");
}

/// Sends `request` through `layer` to an inner service that never
/// answers, and dies once the request is inside it.
pub(crate) fn die_mid_request<S>(layer: &IdempotencyLayer<S>, request: Request<Body>)
where
    S: Store,
{
    let (reached, inside) = oneshot::channel::<()>();
    let reached = Arc::new(Mutex::new(Some(reached)));
    let hangs = service_fn(move |_: Request<Body>| {
        if let Some(tx) = reached.lock().expect("lock").take() {
            let _ = tx.send(());
        }
        std::future::pending::<Result<Response<Body>, Infallible>>()
    });
    die_when(layer.layer(hangs).oneshot(request), inside);
}
