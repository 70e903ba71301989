//! `idem proxy`: the Idempotency-Key gateway in front of any HTTP service.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::{header, HeaderName, HeaderValue, Method, StatusCode, Uri};
use hyper::body::Incoming;
use idem_http::{strip_hop_by_hop, IdemBody, IdempotencyLayer, OutcomeUnknown, Problem};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tower::{Layer as _, ServiceExt as _};
use tower_service::Service;
use tracing::Instrument as _;

use crate::deadline::Deadline;
use crate::forwarded::{self, ForwardedPolicy, Peer};
use crate::store::AnyStore;
use crate::tls::{self, TlsFiles};
use crate::upstream::{self, UpstreamClient, UpstreamProtocol};

/// What the gateway does; see `idem proxy --help` for each setting.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The upstream's base URL (`http://127.0.0.1:3000`,
    /// `https://orders.internal`).
    pub upstream: Uri,
    /// TLS roots and HTTP version for the upstream.
    pub upstream_protocol: UpstreamProtocol,
    /// Covered methods.
    pub methods: Vec<Method>,
    /// The key header.
    pub header: HeaderName,
    /// Refuse covered requests without a key.
    pub require_key: bool,
    /// Where a JSON body holds the key of a request without the header.
    pub key_in_body: Option<idem::derive::json::JsonKey>,
    /// The webhook sender whose signatures are checked before a claim.
    pub webhook: Option<idem_http::Webhook>,
    /// Serve MCP tool calls keyed by this tool argument.
    pub mcp: Option<String>,
    /// The JSON pointers a request's fingerprint covers instead of its
    /// whole body.
    pub fingerprint_fields: Option<Vec<String>>,
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
    /// How long the upstream may take to answer a covered request, head
    /// and body, before a 502 (a gRPC client's `grpc-timeout` is not
    /// forwarded: this bounds the call instead; requests passed through
    /// are not bounded). The request was sent, so the key is kept with an unknown
    /// outcome (see [`OutcomeUnknown`]); connecting is limited to half of
    /// it (at most 5 s), and a failed connect releases the key.
    pub upstream_timeout: Duration,
    /// Forward a request whose key's earlier attempt stopped without an
    /// outcome (the gateway died mid-request) again, instead of answering
    /// 422 `outcome-unknown`: for upstreams that deduplicate on the
    /// forwarded `Idempotency-Key` themselves.
    pub forward_takeovers: bool,
    /// The upstream's URL to ask whether a request whose outcome is
    /// unknown took effect ([`crate::reconcile`]), if any.
    pub reconcile: Option<Uri>,
    /// How often the gateway sweeps the store for keys whose outcome is
    /// unknown and asks `reconcile` about them, without waiting for a
    /// retry ([`crate::reconcile::spawn_sweep`]); `None` never.
    pub reconcile_every: Option<Duration>,
    /// Refuse UUIDv7 keys older than the retention (410 `key-too-old`).
    pub reject_old_uuid_v7: bool,
    /// The longest a duplicate asking `Prefer: wait=N` is held for the
    /// running request's outcome.
    pub max_wait: Duration,
    /// How long a duplicate without `Prefer: wait` is held (zero: 409 at
    /// once).
    pub default_wait: Duration,
    /// Memory for replays of responses stored here (zero: none).
    pub replay_cache_bytes: usize,
    /// The longest a response is replayed from memory (zero: never).
    pub replay_cache_ttl: Duration,
    /// Stored response headers left out of replays.
    pub replay_drop_headers: Vec<HeaderName>,
    /// Replay stored `Set-Cookie` headers (left out by default).
    pub replay_set_cookie: bool,
    /// The field of a gRPC request message holding its key when the
    /// metadata does not (AIP-155 `request_id`).
    pub grpc_request_id_fields: Vec<(Option<String>, u32)>,
    /// What each path prefix stores of its responses for replays.
    pub keep: idem_http::KeepRules,
    /// Where bodies kept by reference go, swept of those no record names.
    pub blobs: Option<idem::blob::Blobs>,
    /// The keys stored responses are sealed with, if any.
    pub keyring: Option<idem::codec::Keyring>,
    /// The secret keys are hashed with at rest, if any.
    pub key_hasher: Option<idem::key_hash::KeyHasher>,
    /// Forwarding headers and `Host`.
    pub forwarded: ForwardedPolicy,
    /// Serve TLS with these files (reloaded on SIGHUP) instead of
    /// cleartext.
    pub tls: Option<TlsFiles>,
}

#[derive(Clone)]
struct Upstream {
    client: UpstreamClient,
    base: Uri,
    /// `base` without its trailing slash, for the span's `url`.
    origin: String,
    /// `base`'s `host:port`, for `Host` when it is not preserved.
    authority: String,
    timeout: Duration,
    forwarded: ForwardedPolicy,
}

/// gRPC's deadline header: not forwarded with a covered call, whose
/// upstream must not cancel it when the client stops waiting.
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The gateway's own 502: nothing was sent to the upstream, so the layer
/// releases the key.
fn bad_gateway(detail: String) -> Response {
    problem_502(
        idem_http::problem_types::UPSTREAM,
        "Upstream unavailable",
        detail,
    )
}

/// The gateway's own 502 when the request may have reached the upstream
/// and its response was lost: marked [`OutcomeUnknown`], so the layer keeps
/// the key (failed, outcome unknown) instead of letting a retry run the
/// request a second time.
fn outcome_unknown(detail: String) -> Response {
    let mut response = problem_502(
        idem_http::problem_types::OUTCOME_UNKNOWN,
        "Upstream outcome unknown",
        format!(
            "{detail}; the upstream may have processed the request, so the key is kept and \
             will not run it again: check the upstream, then `idem release` the key to allow \
             a retry"
        ),
    );
    response.extensions_mut().insert(OutcomeUnknown);
    response
}

fn problem_502(kind: &'static str, title: &'static str, detail: String) -> Response {
    Problem::new(StatusCode::BAD_GATEWAY, kind, title, detail)
        .into_response()
        .map(Body::from)
}

async fn forward(upstream: Arc<Upstream>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    // A covered request carries its run's context: it runs to completion
    // under the gateway's own limit, whatever its client's deadline.
    let covered = parts.extensions.get::<idem::Context>().is_some();
    if covered {
        parts.headers.remove(GRPC_TIMEOUT);
    }
    // An HTTP/2 request names its host in the URI (`:authority`), not in
    // `Host`; the upstream connection decides the version it goes out in.
    if !parts.headers.contains_key(header::HOST) {
        if let Some(host) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            parts.headers.insert(header::HOST, host);
        }
    }
    parts.version = http::Version::HTTP_11;
    join_cookies(&mut parts.headers);
    // `TE: trailers` is the one TE a proxy passes on (RFC 9110 §10.1.4):
    // gRPC servers ask for it, and trailers are forwarded and stored.
    let trailers = wants_trailers(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    if trailers {
        parts
            .headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
    }
    forwarded::apply(
        &mut parts.headers,
        parts.extensions.get::<Arc<Peer>>().map(Arc::as_ref),
        &upstream.authority,
        upstream.forwarded,
    );
    // Until the head is in: the body streams after the span closes.
    let span = tracing::debug_span!(
        "idem.upstream",
        method = %parts.method,
        url = %format_args!(
            "{}{}",
            upstream.origin,
            parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
        ),
        status = tracing::field::Empty,
    );
    let sent = upstream
        .client
        .request(http::Request::from_parts(parts, body));
    if !covered {
        // Passed through (a GET, a download, a stream): its client's own
        // limits govern it, and nothing is kept for it.
        return match sent.instrument(span.clone()).await {
            Ok(response) => {
                span.record("status", response.status().as_u16());
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, Body::new(body))
            }
            Err(e) => bad_gateway(format!(
                "the upstream {} could not be reached or broke off: {e}",
                upstream.base
            )),
        };
    }
    // One limit for the whole answer: a body that stalls is cut off too.
    let deadline = tokio::time::Instant::now() + upstream.timeout;
    match tokio::time::timeout_at(deadline, sent)
        .instrument(span.clone())
        .await
    {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            span.record("status", parts.status.as_u16());
            strip_hop_by_hop(&mut parts.headers);
            let body = Deadline::new(body, deadline, upstream.timeout);
            Response::from_parts(parts, Body::new(body))
        }
        Ok(Err(e)) if e.is_connect() => bad_gateway(format!(
            "the upstream {} could not be reached: {e}; nothing was sent, the key was \
             released, so the request may be retried",
            upstream.base
        )),
        Ok(Err(e)) => outcome_unknown(format!(
            "the connection to the upstream {} failed after the request was sent: {e}",
            upstream.base
        )),
        Err(_) => outcome_unknown(format!(
            "the upstream {} did not answer within {:?}",
            upstream.base, upstream.timeout
        )),
    }
}

/// The gateway's idempotency layer.
pub fn layer(store: AnyStore, config: &ProxyConfig) -> anyhow::Result<IdempotencyLayer<AnyStore>> {
    let mut layer = IdempotencyLayer::builder(store)
        .methods(config.methods.clone())
        .header(config.header.clone())
        .required(config.require_key)
        .retention(config.retention)
        .lease(config.lease)
        .max_request_bytes(config.max_request_bytes)
        .max_response_bytes(config.max_response_bytes)
        .fail_open(config.fail_open)
        .forward_takeovers(config.forward_takeovers)
        .reject_old_uuid_v7(config.reject_old_uuid_v7)
        .max_wait(config.max_wait)
        .default_wait(config.default_wait)
        .replay_cache_bytes(config.replay_cache_bytes)
        .replay_cache_ttl(config.replay_cache_ttl)
        .replay_drop_headers(config.replay_drop_headers.clone())
        .replay_set_cookie(config.replay_set_cookie)
        .keep_rules(config.keep.clone());
    if let Some(url) = &config.reconcile {
        layer = layer.reconciler(crate::reconcile::Probe::new(
            url,
            &config.upstream_protocol,
            (config.header.clone(), config.tenant_header.clone()),
            config.max_response_bytes,
        )?);
    }
    if let Some(keyring) = &config.keyring {
        layer = layer.keyring(keyring.clone());
    }
    if let Some(blobs) = &config.blobs {
        layer = layer.blobs(blobs.clone());
    }
    if let Some(hasher) = &config.key_hasher {
        layer = layer.hash_keys(hasher.clone());
    }
    if let Some(tenant) = &config.tenant_header {
        layer = layer.tenant_header(tenant.clone());
    }
    if let Some(source) = &config.key_in_body {
        layer = layer.key_in_body(source.clone());
    }
    // After the key settings: a webhook sender decides where its key is.
    if let Some(webhook) = &config.webhook {
        layer = layer.webhook(webhook.clone());
    }
    if let Some(argument) = &config.mcp {
        layer = layer.mcp(argument);
        // The MCP default wait, unless one was configured.
        if !config.default_wait.is_zero() {
            layer = layer.default_wait(config.default_wait);
        }
    }
    if let Some(fields) = &config.fingerprint_fields {
        layer = layer.fingerprint(idem_http::FingerprintRule::JsonFields(fields.clone()));
    }
    for (method, field) in &config.grpc_request_id_fields {
        layer = match method {
            Some(path) => layer.grpc_request_id_field_of(path.clone(), *field),
            None => layer.grpc_request_id_field(*field),
        };
    }
    Ok(layer.build()?)
}

/// One `Cookie` field for an HTTP/1.1 upstream: HTTP/2 clients may split
/// it into several, which are joined with `"; "` (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut cookies = headers.get_all(header::COOKIE).iter();
    if cookies.nth(1).is_none() {
        return;
    }
    let joined: Vec<&[u8]> = headers
        .get_all(header::COOKIE)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    if let Ok(joined) = HeaderValue::from_bytes(&joined.join(&b"; "[..])) {
        headers.insert(header::COOKIE, joined);
    }
}

/// Whether a request's `TE` header accepts trailers.
fn wants_trailers(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
}

/// The gateway's service: every request forwarded to the upstream, covered
/// ones through `layer`. Fails on upstream TLS settings that cannot work
/// (an unreadable CA file).
///
/// No router in front of it: every path goes the same way, and axum's
/// route matching, boxed service clone, response boxing and per-poll
/// shutdown select were a tenth of the hop's instructions (BENCHMARKS.md).
pub fn service(
    layer: IdempotencyLayer<AnyStore>,
    config: &ProxyConfig,
) -> anyhow::Result<
    impl Service<
            http::Request<Incoming>,
            Response = http::Response<IdemBody>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static,
> {
    // Connecting gets its own, shorter limit, so an upstream that is down
    // is told apart (nothing sent: the key is released) from one that took
    // the request and never answered (the key is kept).
    let connect_timeout = (config.upstream_timeout / 2).min(Duration::from_secs(5));
    let upstream = Arc::new(Upstream {
        client: upstream::client(&config.upstream, &config.upstream_protocol, connect_timeout)?,
        base: config.upstream.clone(),
        origin: config.upstream.to_string().trim_end_matches('/').to_owned(),
        authority: config
            .upstream
            .authority()
            .map_or_else(String::new, |a| a.to_string()),
        timeout: config.upstream_timeout,
        forwarded: config.forwarded,
    });
    let forwarding = tower::service_fn(move |request: Request| {
        let upstream = Arc::clone(&upstream);
        async move { Ok::<_, Infallible>(forward(upstream, request).await) }
    });
    Ok(layer
        .layer(forwarding)
        .map_request(|request: http::Request<Incoming>| request.map(Body::new)))
}

/// What the admin listener serves: `/healthz`, the metrics the process
/// records, and the console when an admin token is set.
#[derive(Debug)]
pub struct Admin {
    /// Where it listens.
    pub listener: TcpListener,
    /// The process's Prometheus recorder, if it installed one.
    pub metrics: Option<PrometheusHandle>,
    /// The operator console, if served.
    pub console: Option<crate::console::Console>,
}

/// The admin listener's router: `/metrics` (Prometheus text),
/// `/healthz`, and `/console` (on `store`) when `console` is given.
pub fn admin_router(
    metrics: Option<PrometheusHandle>,
    console: Option<crate::console::Console>,
    store: &AnyStore,
) -> Router {
    let console = match console {
        Some(console) => console.router(store.clone()),
        None => Router::new()
            .route("/console", get(|| async { crate::console::not_served() }))
            .route(
                "/console/{*rest}",
                get(|| async { crate::console::not_served() }),
            ),
    };
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
        .merge(console)
}

/// How often the gateway sweeps blobs no record names.
const BLOB_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Serves the gateway on `listener` (and the admin routes on `admin`, if
/// given) until `shutdown` resolves; then stops accepting, lets in-flight
/// requests finish (their keys completed or released), including those
/// whose clients went away, and returns.
pub async fn serve(
    store: AnyStore,
    config: &ProxyConfig,
    listener: TcpListener,
    admin: Option<Admin>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    if let Some(warning) = listener
        .local_addr()
        .ok()
        .and_then(|at| tenant_warning(config, at))
    {
        tracing::warn!("{warning}");
    }
    let layer = layer(store.clone(), config)?;
    let app = service(layer.clone(), config)?;
    let _purger = store.spawn_purger();
    let _reconciler = match (&config.reconcile, config.reconcile_every) {
        (Some(_), Some(every)) if config.key_hasher.is_none() => Some(
            crate::reconcile::spawn_sweep(store.clone(), layer.clone(), every),
        ),
        (Some(_), Some(_)) => {
            tracing::warn!(
                "no sweep for outcomes unknown: with --key-secret the upstream would be asked \
                 about hashed keys; retries are still reconciled"
            );
            None
        }
        _ => None,
    };
    let _sweeper = config
        .blobs
        .clone()
        .map(|blobs| idem::blob::spawn_blob_sweeper(store.clone(), blobs, BLOB_SWEEP_EVERY, 1_000));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admin_task = admin.map(|admin| {
        let mut stop = stop_rx.clone();
        let forgets = layer.clone();
        let console = admin
            .console
            .map(|console| console.forgetting(move |id| forgets.forget_stored(id)));
        let router = admin_router(admin.metrics, console, &store);
        tokio::spawn(async move {
            axum::serve(admin.listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        })
    });
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = stop_tx.send(true);
    };
    let acceptor = match &config.tls {
        Some(files) => {
            let certificate = tls::Certificate::load(files.clone())?;
            tls::reload_on_hangup(Arc::clone(&certificate));
            Some(certificate.acceptor())
        }
        None => None,
    };
    let served = crate::connections::serve(listener, acceptor, app, shutdown).await;
    // Requests whose clients disconnected are not connections any more;
    // their runs still finish before the process exits.
    if layer.running() > 0 {
        tracing::info!(
            running = layer.running(),
            "waiting for requests whose clients went away"
        );
    }
    layer.drain().await;
    if let Some(task) = admin_task {
        task.await??;
    }
    served?;
    Ok(())
}

/// What to warn of when a gateway listening on `at` keeps no tenant apart:
/// on an address other machines reach, every client shares one key space,
/// so one client's key, sent with the same body by another, replays the
/// first client's response.
pub fn tenant_warning(config: &ProxyConfig, at: SocketAddr) -> Option<String> {
    (config.tenant_header.is_none() && !at.ip().is_loopback()).then(|| {
        format!(
            "listening on {at} with no --tenant-header: all clients share one key space, so \
             a client that sends another's key and body gets the other's stored response; \
             give the header your authentication proxy sets per caller"
        )
    })
}

/// The address a listener is bound to, for messages.
pub fn local_addr(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a: SocketAddr| a.to_string())
}
