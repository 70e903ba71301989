//! `idem serve`: the claim API, so that programs in any language get the
//! same records, leases, fences and step journal as the Rust library, over
//! HTTP and JSON. `openapi.yaml` (served at `/openapi.yaml`) describes it;
//! the Python and TypeScript clients in `clients/` call it.
//!
//! Each bearer token acts for one tenant, and every record a caller names
//! is kept under its tenant's name: no token can see or touch another
//! tenant's records.

mod api;
pub mod problems;
mod tenants;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_http::Problem;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::task::TaskTracker;

use api::{Api, Outbox, Shared};
use idem::outbox::{Sender, DEFAULT_DISPATCH_INTERVAL};
use idem::Store as _;
pub use tenants::{Tenants, MAX_TENANT_LEN, MIN_TOKEN_LEN, OPEN_TENANT};

use crate::store::AnyStore;
use crate::tls::{self, TlsFiles};

/// The OpenAPI 3.1 description of the API, as committed in the repository.
pub const OPENAPI: &str = include_str!("../../openapi.yaml");

/// `idem serve` settings: each from its flag, else its `IDEM_*` variable,
/// else the default.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Where the API listens.
    #[arg(long, env = "IDEM_SERVE_LISTEN", default_value = "127.0.0.1:8700")]
    pub listen: String,
    /// A TOML file giving each tenant its bearer tokens
    /// (`[tenants]` then `shop = ["TOKEN"]`). Without it every caller is
    /// one tenant, and only a loopback address may be listened on.
    #[arg(long, env = "IDEM_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// The lease of a claim that does not say.
    #[arg(long, env = "IDEM_LEASE", default_value = "30s")]
    pub lease: String,
    /// How long outcomes are kept when a write does not say.
    #[arg(long, env = "IDEM_RETENTION", default_value = "24h")]
    pub retention: String,
    /// The longest a claim may wait for a running duplicate's outcome
    /// (`wait_ms`); longer asks are cut to it. 0 never waits.
    #[arg(long, env = "IDEM_MAX_WAIT", default_value = "30s")]
    pub max_wait: String,
    /// The largest request body, bytes (a stored response or step result
    /// is at most this).
    #[arg(long, env = "IDEM_MAX_REQUEST_BYTES", default_value_t = 1 << 20)]
    pub max_request_bytes: usize,
    /// The longest lease a claim may ask for: a holder that dies keeps its
    /// key from everyone this long. Long work extends a short lease
    /// instead.
    #[arg(long, env = "IDEM_MAX_LEASE", default_value = "1h")]
    pub max_lease: String,
    /// Serve HTTPS with this certificate chain (PEM, leaf first), read
    /// again on SIGHUP; needs --tls-key. Bearer tokens sent to any address
    /// but loopback should only ever travel this way.
    #[arg(long, env = "IDEM_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert, read again on SIGHUP.
    #[arg(long, env = "IDEM_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The broker the messages callers' runs send go to (`nats://…`,
    /// `amqp://…`, `kafka://…`, `sqs://…`, each in a build with its
    /// feature): sent as soon as each run is stored, and by a dispatcher
    /// running in the server. Without it the messages are stored and left
    /// for `idem outbox run` over the same store.
    #[arg(long, env = "IDEM_SERVE_OUTBOX")]
    pub outbox: Option<String>,
    /// Where /metrics, /healthz and, with --admin-token, the operator
    /// console are served [default: none].
    #[arg(long, env = "IDEM_SERVE_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// Serve the operator console on --admin-listen (ignored without it)
    /// to whoever signs in with this token (16 characters or more); prefer
    /// the variable to the flag, which `ps` shows [default: no console].
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// How often the console's charts sample the metrics [default: 10s].
    #[arg(long, env = "IDEM_CONSOLE_EVERY")]
    pub console_every: Option<String>,
}

/// Where `idem serve` sends the messages runs send.
#[derive(Clone)]
pub struct ServeOutbox {
    /// The broker's URL, as given.
    pub url: String,
    /// Its sender.
    pub sender: Arc<dyn Sender>,
}

impl std::fmt::Debug for ServeOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOutbox")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// The claim API's settings, checked.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Who may call, as which tenant.
    pub tenants: Tenants,
    /// A claim's lease when it does not say.
    pub lease: Duration,
    /// An outcome's retention when a write does not say.
    pub retention: Duration,
    /// The longest a claim waits for a running duplicate.
    pub max_wait: Duration,
    /// The largest request body, bytes.
    pub max_request_bytes: usize,
    /// The longest lease a claim or heartbeat may ask for.
    pub max_lease: Duration,
    /// Serve TLS with these files (reloaded on SIGHUP) instead of
    /// cleartext.
    pub tls: Option<TlsFiles>,
    /// Results and step results sealed with `--keyring`, keys hashed with
    /// `--key-secret` (default: neither).
    pub secrets: crate::payload::Secrets,
    /// Where runs' messages are sent (`--outbox`); `None` leaves them to a
    /// dispatcher elsewhere.
    pub outbox: Option<ServeOutbox>,
}

impl ServeArgs {
    /// The settings, checked, with `--outbox`'s sender connected (see
    /// [`config`](Self::config)).
    pub async fn open(&self, secrets: crate::payload::Secrets) -> anyhow::Result<ServeConfig> {
        let mut config = self.config(secrets)?;
        if let Some(url) = &self.outbox {
            let sender = url
                .parse::<idem_engine::SenderUrl>()
                .map_err(|e| anyhow::anyhow!("--outbox: {e}"))?
                .open()
                .await
                .map_err(|e| anyhow::anyhow!("--outbox: {e}"))?;
            config.outbox = Some(ServeOutbox {
                url: url.clone(),
                sender,
            });
        }
        Ok(config)
    }

    /// The settings, checked; the tokens file is read (`--outbox` is not
    /// connected: see [`open`](Self::open)). `secrets` are the global
    /// `--keyring` and `--key-secret`.
    pub fn config(&self, secrets: crate::payload::Secrets) -> anyhow::Result<ServeConfig> {
        let tenants = match &self.tokens {
            Some(path) => Tenants::from_file(path)?,
            None => {
                let loopback = self
                    .listen
                    .parse::<SocketAddr>()
                    .map(|a| a.ip().is_loopback())
                    .unwrap_or(self.listen.starts_with("localhost:"));
                anyhow::ensure!(
                    loopback,
                    "--listen {}: without --tokens, idem serve lets anyone who can reach it \
                     act on every record, so it only listens on a loopback address",
                    self.listen
                );
                Tenants::open()
            }
        };
        let lease = crate::duration("--lease", &self.lease)?;
        let max_lease = crate::duration("--max-lease", &self.max_lease)?;
        anyhow::ensure!(
            lease <= max_lease,
            "--lease {} is longer than --max-lease {}: every claim that does not say its \
             lease would be refused",
            self.lease,
            self.max_lease
        );
        Ok(ServeConfig {
            tenants,
            lease,
            retention: crate::duration("--retention", &self.retention)?,
            max_wait: crate::wait("--max-wait", &self.max_wait)?,
            max_request_bytes: self.max_request_bytes,
            max_lease,
            secrets,
            outbox: None,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                (None, None) => None,
                _ => anyhow::bail!("--tls-cert and --tls-key go together: give both or neither"),
            },
        })
    }
}

/// The API's routes over `store`, and the tracker of writes still running
/// for callers that went away.
pub fn router(store: AnyStore, config: ServeConfig) -> anyhow::Result<(Router, TaskTracker)> {
    let (router, writes, _) = routes(store, config)?;
    Ok((router, writes))
}

/// [`router`], and the executor that keeps and sends runs' messages.
fn routes(store: AnyStore, config: ServeConfig) -> anyhow::Result<(Router, TaskTracker, Outbox)> {
    anyhow::ensure!(
        store.keeps_bytes(),
        "idem serve keeps its records in a store it reaches itself (SQLite, Redis, PostgreSQL, \
         MySQL, DynamoDB), not behind another idem serve"
    );
    let writes = TaskTracker::new();
    let outbox = outbox_executor(&store, &config)?;
    let api: Shared = Arc::new(Api {
        store,
        config,
        writes: writes.clone(),
        outbox: outbox.clone(),
    });
    let router = Router::new()
        .route("/v1/claim", post(claim))
        .route("/v1/complete", post(complete))
        .route("/v1/fail", post(fail))
        .route("/v1/extend", post(extend))
        .route("/v1/release", post(release))
        .route("/v1/steps/begin", post(begin_step))
        .route("/v1/steps/finish", post(finish_step))
        .route("/v1/record", get(record))
        .route("/v1/steps", get(steps))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/openapi.yaml", get(openapi))
        .fallback(|uri: Uri| async move { problem(problems::no_route(uri.path())) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            problem(problems::wrong_method(&method, uri.path()))
        })
        .with_state(api);
    Ok((router, writes, outbox))
}

/// The executor through which the API keeps the messages callers' runs
/// send: its markers claimed with the server's lease and retention, its
/// sends through `--outbox` (or none: a dispatcher elsewhere sends).
fn outbox_executor(store: &AnyStore, config: &ServeConfig) -> anyhow::Result<Outbox> {
    let mut builder = idem::Idempotency::builder(store.clone())
        .lease(config.lease)
        .retention(config.retention.max(config.lease));
    if let Some(keyring) = config.secrets.at_rest().keyring() {
        builder = builder.keyring(keyring.clone());
    }
    builder = match &config.outbox {
        Some(outbox) => builder.outbox(Arc::clone(&outbox.sender)),
        None => builder.outbox_sent_elsewhere(),
    };
    builder
        .build()
        .map_err(|e| anyhow::anyhow!("the outbox: {e}"))
}

/// `--admin-listen`'s listener, served in a task until the handle is
/// dropped: `/metrics`, `/healthz` and, with `--admin-token`, the console
/// (without charts: the claim API runs no handlers, so their metrics are
/// not recorded here). `None` without `--admin-listen`.
pub async fn admin(
    args: &ServeArgs,
    secrets: crate::payload::Secrets,
    store: &AnyStore,
) -> anyhow::Result<Option<tokio_util::task::AbortOnDropHandle<std::io::Result<()>>>> {
    Ok(match &args.admin_listen {
        Some(addr) => {
            let admin = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (admin): {e}"))?;
            let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .map_err(|e| tracing::warn!(error = %e, "metrics recorder not installed"))
                .ok();
            // No charts: the claim API runs no handlers, so the metrics
            // they would draw are not recorded here.
            let console = crate::console::Console::from_settings(
                args.admin_token.as_deref(),
                args.console_every.as_deref(),
                secrets,
                None,
            )?;
            if console.is_some() {
                crate::console::warn_if_exposed(&admin);
            }
            tracing::info!(admin = %crate::proxy::local_addr(&admin), "admin listener");
            let router = crate::proxy::admin_router(metrics, console, store);
            Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                async move { axum::serve(admin, router).await },
            )))
        }
        None => {
            if args.admin_token.is_some() {
                tracing::warn!("an admin token is set but no --admin-listen: no console is served");
            }
            None
        }
    })
}

/// Serves the API on `listener` until `shutdown` resolves; then stops
/// accepting, and returns once in-flight requests, and writes whose
/// callers went away, have finished.
pub async fn serve(
    store: AnyStore,
    config: ServeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let _purger = store.spawn_purger();
    let tls = config.tls.clone();
    if tls.is_none() && !config.tenants.is_open() {
        if let Some(at) = listener.local_addr().ok().filter(|a| !a.ip().is_loopback()) {
            tracing::warn!(
                "listening on {at} in cleartext: bearer tokens cross the network readable; \
                 give --tls-cert and --tls-key"
            );
        }
    }
    let sends = config.outbox.is_some();
    let (router, writes, outbox) = routes(store, config)?;
    let _dispatcher = sends.then(|| outbox.spawn_outbox_dispatcher(DEFAULT_DISPATCH_INTERVAL));
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: finishing in-flight requests");
    };
    let served = match tls {
        Some(files) => {
            let certificate = tls::Certificate::load(files)?;
            tls::reload_on_hangup(Arc::clone(&certificate));
            tls::serve(listener, certificate.acceptor(), router, shutdown).await
        }
        None => axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(Into::into),
    };
    writes.close();
    writes.wait().await;
    served
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        OPENAPI.to_owned(),
    )
        .into_response()
}

fn problem(problem: Problem) -> Response {
    let mut response = problem.into_response().map(Body::from);
    if response.status() == StatusCode::UNAUTHORIZED {
        // RFC 9110 §11.6.1: a 401 names the scheme it wants.
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"idem\""),
        );
    }
    response
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => {
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(e) => problem(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            problems::STORE_ERROR,
            "answer not encoded",
            e.to_string(),
        )),
    }
}

/// The caller's tenant, from its bearer token. Without tokens, only a
/// request addressed to a loopback name is served: a web page that
/// reaches the port through a name of its own (DNS rebinding) is refused.
fn tenant(api: &Api, headers: &HeaderMap, uri: &Uri) -> Result<Arc<str>, Problem> {
    if api.config.tenants.is_open() {
        // HTTP/2 names the host in the URI (`:authority`), not in `Host`.
        let host = headers
            .get(header::HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
            .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
            .unwrap_or_default();
        if !loopback_host(&host) {
            return Err(problems::not_loopback(&host));
        }
    }
    api.config
        .tenants
        .tenant(
            headers
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes),
        )
        .ok_or_else(problems::unauthorized)
}

/// Whether `host` (a `Host` header: a name or address, and maybe a port)
/// names this machine's loopback interface.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((address, rest)) if rest.is_empty() || rest.starts_with(':') => address,
            _ => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the request says its body is JSON.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|t| t.to_str().ok())
        .and_then(|t| t.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// The request body as `T`, read up to the size limit.
async fn read<T: DeserializeOwned>(api: &Api, body: Body) -> Result<T, Problem> {
    let limit = api.config.max_request_bytes;
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(problems::too_large(limit))
        }
        Err(e) => {
            return Err(problems::bad_request(format!(
                "the body could not be read: {e}"
            )))
        }
    };
    let mut json = serde_json::Deserializer::from_slice(&bytes);
    let value = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let at = e.path().to_string();
        let at = if at == "." {
            String::new()
        } else {
            format!("{at}: ")
        };
        problems::bad_request(format!(
            "the body is not the JSON expected: {at}{}",
            e.inner()
        ))
    })?;
    json.end()
        .map_err(|e| problems::bad_request(format!("the body is not the JSON expected: {e}")))?;
    Ok(value)
}

/// The `scope` and `key` of a query string.
fn scope_and_key(query: Option<&str>) -> Result<(String, String), Problem> {
    let (mut scope, mut key) = (None, None);
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*name {
            "scope" => scope = Some(value.into_owned()),
            "key" => key = Some(value.into_owned()),
            other => {
                return Err(problems::bad_request(format!(
                    "unknown query parameter {other:?} (scope and key are taken)"
                )))
            }
        }
    }
    match (scope, key) {
        (Some(scope), Some(key)) => Ok((scope, key)),
        _ => Err(problems::bad_request(
            "the query must give both scope and key",
        )),
    }
}

/// One POST route: the tenant, the body as `$request`, the operation, and
/// its answer as JSON (or 204 when it has none).
macro_rules! post_route {
    ($name:ident, $request:ty, $status:expr) => {
        async fn $name(
            State(api): State<Shared>,
            uri: Uri,
            headers: HeaderMap,
            body: Body,
        ) -> Response {
            let answered = async {
                let tenant = tenant(&api, &headers, &uri)?;
                if api.config.tenants.is_open() && !is_json(&headers) {
                    return Err(problems::not_json());
                }
                let request: $request = read(&api, body).await?;
                api.$name(&tenant, request).await
            }
            .await;
            match answered {
                Ok(answer) => answer_with($status, &answer),
                Err(p) => problem(p),
            }
        }
    };
}

/// A JSON answer, or an empty 204 for `()`.
fn answer_with<T: Serialize>(status: StatusCode, answer: &T) -> Response {
    if status == StatusCode::NO_CONTENT {
        StatusCode::NO_CONTENT.into_response()
    } else {
        json(status, answer)
    }
}

post_route!(claim, idem_remote::wire::ClaimRequest, StatusCode::OK);
post_route!(
    complete,
    idem_remote::wire::CompleteRequest,
    StatusCode::NO_CONTENT
);
post_route!(fail, idem_remote::wire::FailRequest, StatusCode::NO_CONTENT);
post_route!(extend, idem_remote::wire::ExtendRequest, StatusCode::OK);
post_route!(
    release,
    idem_remote::wire::ReleaseRequest,
    StatusCode::NO_CONTENT
);
post_route!(
    begin_step,
    idem_remote::wire::StepBeginRequest,
    StatusCode::OK
);
post_route!(
    finish_step,
    idem_remote::wire::StepFinishRequest,
    StatusCode::NO_CONTENT
);

/// One GET route on a record: the tenant, `scope` and `key` from the
/// query, the operation, and its answer as JSON.
macro_rules! get_route {
    ($name:ident) => {
        async fn $name(
            State(api): State<Shared>,
            uri: Uri,
            headers: HeaderMap,
            RawQuery(query): RawQuery,
        ) -> Response {
            let answered = async {
                let tenant = tenant(&api, &headers, &uri)?;
                let (scope, key) = scope_and_key(query.as_deref())?;
                api.$name(&tenant, &scope, &key).await
            }
            .await;
            match answered {
                Ok(answer) => json(StatusCode::OK, &answer),
                Err(p) => problem(p),
            }
        }
    };
}

get_route!(record);
get_route!(steps);
