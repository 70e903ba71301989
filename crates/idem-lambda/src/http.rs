//! The `Idempotency-Key` layer behind API Gateway (REST and HTTP APIs),
//! an Application Load Balancer or a function URL.

use std::future::poll_fn;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt as _, Full};
use tower_service::Service;

/// Runs `service` as the function, for HTTP events: each request arrives
/// as an `http::Request` with its whole body, and the response goes back
/// to whichever front door sent it. Wrap the service in
/// `idem_http::IdempotencyLayer` (an axum `Router` with the layer, say) and
/// every status of the layer's table reaches the client as it would from
/// a server: the replayed response with `Idempotent-Replayed: true`, 409
/// while the first request runs, 422 for a key reused with another body.
///
/// The response body is read whole before it is handed to `lambda_http`
/// (a body that fails fails the invocation, which the client sees as a
/// 502), and sent as text unless its `Content-Type` says binary: give
/// binary responses theirs.
///
/// Lambda kills a function at its timeout without telling it, so a run
/// cut short there keeps its claim until its lease runs out, and retries
/// meanwhile get 409 with `Retry-After`: give the executor a lease near
/// the function's timeout (its heartbeats extend it while a run goes on).
pub async fn run_http<I, RB>(service: I) -> Result<(), lambda_runtime::Error>
where
    I: Service<Request<Full<Bytes>>, Response = Response<RB>> + Clone + Send + 'static,
    I::Future: Send,
    I::Error: Into<lambda_runtime::Error>,
    RB: http_body::Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<lambda_runtime::Error>,
{
    lambda_http::run(lambda_http::service_fn(
        move |request: lambda_http::Request| {
            let mut service = service.clone();
            async move {
                let (parts, body) = request.into_parts();
                let request = Request::from_parts(parts, Full::new(Bytes::copy_from_slice(&body)));
                poll_fn(|cx| service.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                let response = service.call(request).await.map_err(Into::into)?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await.map_err(Into::into)?.to_bytes();
                Ok::<_, lambda_runtime::Error>(Response::from_parts(parts, Full::new(body)))
            }
        },
    ))
    .await
}
