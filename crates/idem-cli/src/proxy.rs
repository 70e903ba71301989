//! `idem proxy`: the Idempotency-Key gateway in front of any HTTP service.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::{header, HeaderName, HeaderValue, Method, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem_http::{strip_hop_by_hop, IdempotencyLayer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::store::AnyStore;

/// What the gateway does; see `idem proxy --help` for each setting.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The upstream's base URL (`http://127.0.0.1:3000`).
    pub upstream: Uri,
    /// Covered methods.
    pub methods: Vec<Method>,
    /// The key header.
    pub header: HeaderName,
    /// Refuse covered requests without a key.
    pub require_key: bool,
    /// The tenant discriminator header, if any.
    pub tenant_header: Option<HeaderName>,
    /// How long completed keys are remembered.
    pub retention: Duration,
    /// How long a claim lasts without a heartbeat.
    pub lease: Duration,
    /// The largest request body on covered methods.
    pub max_request_bytes: usize,
    /// The largest response body stored.
    pub max_response_bytes: usize,
    /// Pass requests through when the store is unreachable.
    pub fail_open: bool,
    /// How long the upstream may take to answer before 502 (and release).
    pub upstream_timeout: Duration,
}

#[derive(Clone)]
struct Upstream {
    client: Client<HttpConnector, Body>,
    base: Uri,
    /// `base` without its trailing slash, made once rather than per request.
    origin: String,
    timeout: Duration,
}

fn bad_gateway(detail: String) -> Response {
    let body = serde_json::json!({
        "type": idem_http::problem_types::UPSTREAM,
        "title": "Upstream unavailable",
        "status": 502,
        "detail": detail,
    });
    (
        StatusCode::BAD_GATEWAY,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

async fn forward(State(upstream): State<Arc<Upstream>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let target = format!(
        "{}{}",
        upstream.origin,
        parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
    );
    parts.uri = match target.parse() {
        Ok(uri) => uri,
        Err(e) => return bad_gateway(format!("cannot build the upstream URL {target:?}: {e}")),
    };
    strip_hop_by_hop(&mut parts.headers);
    let sent = upstream
        .client
        .request(http::Request::from_parts(parts, body));
    match tokio::time::timeout(upstream.timeout, sent).await {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        Ok(Err(e)) => bad_gateway(format!(
            "the upstream {} could not be reached: {e}; the key was released, so the request \
             may be retried",
            upstream.base
        )),
        Err(_) => bad_gateway(format!(
            "the upstream {} did not answer within {:?}; the key was released, so the request \
             may be retried",
            upstream.base, upstream.timeout
        )),
    }
}

/// The gateway's router: every request forwarded to the upstream, covered
/// ones through the idempotency layer.
pub fn router(store: AnyStore, config: &ProxyConfig) -> anyhow::Result<Router> {
    let mut layer = IdempotencyLayer::builder(store)
        .methods(config.methods.clone())
        .header(config.header.clone())
        .required(config.require_key)
        .retention(config.retention)
        .lease(config.lease)
        .max_request_bytes(config.max_request_bytes)
        .max_response_bytes(config.max_response_bytes)
        .fail_open(config.fail_open);
    if let Some(tenant) = &config.tenant_header {
        layer = layer.tenant_header(tenant.clone());
    }
    let layer = layer.build()?;
    let upstream = Arc::new(Upstream {
        client: Client::builder(TokioExecutor::new()).build_http(),
        base: config.upstream.clone(),
        origin: config.upstream.to_string().trim_end_matches('/').to_owned(),
        timeout: config.upstream_timeout,
    });
    Ok(Router::new()
        .fallback(forward)
        .with_state(upstream)
        .layer(layer))
}

/// The admin listener's router: `/metrics` (Prometheus text) and
/// `/healthz`.
pub fn admin_router(metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    match metrics {
                        Some(handle) => (
                            StatusCode::OK,
                            [(
                                header::CONTENT_TYPE,
                                HeaderValue::from_static("text/plain; version=0.0.4"),
                            )],
                            handle.render(),
                        )
                            .into_response(),
                        None => (
                            StatusCode::NOT_FOUND,
                            "metrics are recorded by another recorder in this process\n",
                        )
                            .into_response(),
                    }
                }
            }),
        )
}

/// Serves the gateway on `listener` (and the admin routes on `admin`, if
/// given) until `shutdown` resolves; then stops accepting, lets in-flight
/// requests finish (their keys completed or released) and returns.
pub async fn serve(
    store: AnyStore,
    config: &ProxyConfig,
    listener: TcpListener,
    admin: Option<(TcpListener, Option<PrometheusHandle>)>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = router(store.clone(), config)?;
    let _purger = store.spawn_purger();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admin_task = admin.map(|(listener, metrics)| {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            axum::serve(listener, admin_router(metrics))
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        })
    });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: finishing in-flight requests");
            let _ = stop_tx.send(true);
        })
        .await;
    if let Some(task) = admin_task {
        task.await??;
    }
    served?;
    Ok(())
}

/// The address a listener is bound to, for messages.
pub fn local_addr(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a: SocketAddr| a.to_string())
}
