//! The operator console: records by state and scope, a record with its
//! step journal, parked runs resolved or released, failure groups
//! redriven, and charts of the process's metrics — pages served on the
//! admin listener under `/console` (the gateway's, or `idem console`'s
//! own), signed into with the admin token.
//!
//! Every button runs the same function as the CLI command of its name
//! ([`admin::release`](crate::admin::release), [`admin::resolve`](crate::admin::resolve),
//! [`failures::redrive`](crate::failures::redrive)); each asks to be
//! confirmed first, and each change is logged (target
//! `idem::console::audit`).

mod actions;
mod auth;
pub mod history;
mod html;
mod pages;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use idem::RecordId;
use metrics_exporter_prometheus::PrometheusHandle;

pub use auth::AdminToken;
pub use history::History;

use crate::admin::Secrets;
use crate::store::AnyStore;

/// The console's settings: who may sign in, how records are opened, and
/// the metrics history its charts draw, if the process keeps one.
#[derive(Debug, Clone)]
pub struct Console {
    token: AdminToken,
    secrets: Secrets,
    history: Option<Arc<History>>,
    forget: Option<Forget>,
}

/// What drops a record's replay from a serving process's memory after the
/// console changed the record.
#[derive(Clone)]
struct Forget(Arc<dyn Fn(&RecordId) + Send + Sync>);

impl std::fmt::Debug for Forget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Forget(…)")
    }
}

impl Console {
    /// A console for the holder of `token`; `secrets` hash the keys
    /// searched for and open sealed results, as for the admin commands.
    pub fn new(token: AdminToken, secrets: Secrets) -> Self {
        Self {
            token,
            secrets,
            history: None,
            forget: None,
        }
    }

    /// Calls `forget` with each record (as stored) the console releases,
    /// resolves or redrives: the gateway drops its in-memory replay of it,
    /// so the key's next request runs at once rather than after the replay
    /// cache's time to live.
    #[must_use]
    pub fn forgetting(mut self, forget: impl Fn(&RecordId) + Send + Sync + 'static) -> Self {
        self.forget = Some(Forget(Arc::new(forget)));
        self
    }

    /// Tells the serving process that `stored` changed.
    fn changed(&self, stored: &RecordId) {
        if let Some(Forget(forget)) = &self.forget {
            forget(stored);
        }
    }

    /// The console a process's flags ask for: `None` without a token;
    /// charts of `metrics`, if given, sampled every `every` (default 10 s).
    pub fn from_settings(
        token: Option<&str>,
        every: Option<&str>,
        secrets: Secrets,
        metrics: Option<&PrometheusHandle>,
    ) -> anyhow::Result<Option<Self>> {
        let Some(token) = token else {
            return Ok(None);
        };
        let token = AdminToken::new(token).map_err(|e| anyhow::anyhow!("--admin-token: {e}"))?;
        let mut console = Self::new(token, secrets);
        if let Some(metrics) = metrics {
            let every = match every {
                Some(text) => crate::duration("--console-every", text)?,
                None => history::EVERY,
            };
            console = console.with_history(History::spawn(metrics.clone(), every));
        }
        Ok(Some(console))
    }

    /// Charts drawn from `history`.
    #[must_use]
    pub fn with_history(mut self, history: Arc<History>) -> Self {
        self.history = Some(history);
        self
    }

    /// The console's routes, under `/console`, on `store`.
    pub fn router(self, store: AnyStore) -> Router {
        let app = Arc::new(App {
            console: self,
            store,
        });
        let signed_in = Router::new()
            .route("/console", get(pages::overview))
            .route("/console/records", get(pages::records))
            .route("/console/record", get(pages::record))
            .route("/console/search", post(pages::search))
            .route("/console/failures", get(pages::failures))
            .route("/console/history.json", get(pages::history))
            .route("/console/release", post(actions::release))
            .route("/console/resolve", post(actions::resolve))
            .route("/console/redrive", post(actions::redrive))
            .route("/console/logout", post(actions::sign_out))
            .route_layer(middleware::from_fn_with_state(app.clone(), signed_in_only));
        Router::new()
            .route("/console/login", get(pages::login).post(actions::sign_in))
            .route("/console/", get(|| async { Redirect::to("/console") }))
            .merge(signed_in)
            .with_state(app)
    }
}

/// What every console handler reads.
struct App {
    console: Console,
    store: AnyStore,
}

type Shared = State<Arc<App>>;

/// Lets a signed-in request through; sends a browser to the sign-in page
/// and answers anything else (a script's wrong token, a POST) 401.
async fn signed_in_only(State(app): Shared, request: Request, next: Next) -> Response {
    if app.console.token.admits(request.headers()) {
        return next.run(request).await;
    }
    let browser = !request.headers().contains_key(header::AUTHORIZATION)
        && !request.uri().path().ends_with(".json");
    if request.method() == Method::GET && browser {
        return Redirect::to("/console/login").into_response();
    }
    let mut response = html::problem(
        StatusCode::UNAUTHORIZED,
        "sign in with the admin token first (or send it as a bearer token)",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"idem console\""),
    );
    response
}

/// The answer to a console request on a listener that serves no console.
pub fn not_served() -> Response {
    (
        StatusCode::NOT_FOUND,
        "the console is served when an admin token is set: --admin-token or IDEM_ADMIN_TOKEN\n",
    )
        .into_response()
}

/// `idem console`'s settings.
#[derive(Debug, clap::Args)]
pub struct ConsoleArgs {
    /// Where the console listens.
    #[arg(long, env = "IDEM_CONSOLE_LISTEN", default_value = "127.0.0.1:9091")]
    pub listen: String,
    /// The token to sign in with (16 characters or more) [default: a new
    /// random one, printed at start].
    #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
}

/// `idem console`: serves the console on `store` until `shutdown`
/// resolves. Without a token it makes one and prints it once.
pub async fn serve_alone(
    store: AnyStore,
    args: &ConsoleArgs,
    secrets: Secrets,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let token = match args.admin_token.as_deref() {
        Some(token) => AdminToken::new(token).map_err(|e| anyhow::anyhow!("--admin-token: {e}"))?,
        None => AdminToken::random(),
    };
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    warn_if_exposed(&listener);
    let at = crate::proxy::local_addr(&listener);
    if args.admin_token.is_none() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "idem console: sign in at http://{at}/console with the admin token {}",
                token.reveal()
            );
        }
    }
    tracing::info!(listen = %at, "idem console ready");
    let router = Console::new(token, secrets)
        .router(store)
        .route("/", get(|| async { Redirect::to("/console") }));
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// Warns when the console listens where other machines reach it without
/// TLS: the admin token and the session cookie cross the network
/// readable.
pub fn warn_if_exposed(listener: &tokio::net::TcpListener) {
    if let Some(at) = listener.local_addr().ok().filter(|a| !a.ip().is_loopback()) {
        tracing::warn!(
            "the console listens on {at} in cleartext: its token and cookie cross the network \
             readable; listen on a loopback address and reach it through an SSH tunnel or a TLS proxy"
        );
    }
}
