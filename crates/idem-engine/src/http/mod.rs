//! The `Idempotency-Key` middleware of every language, deciding as the
//! tower layer [`idem_http::IdempotencyLayer`] decides.
//!
//! A framework adapter (ASGI, WSGI, Express, Fastify) hands each request
//! to [`HttpGuard::begin`] as text and bytes. The layer itself reads the
//! key, checks the body and its fingerprint, claims the key, and answers
//! refusals and replays ([`Exchange::Answer`]); when the request is to
//! run, it gives the adapter its [`Turn`]. The adapter runs its handler on
//! its own thread or event loop, under the run's [`RunContext`] (its
//! fence, the lease-lost check, steps), and hands the handler's response
//! to [`Turn::finish`]: the layer stores it (or releases the key, by the
//! same status table) and gives back the answer to send. The heartbeat
//! meanwhile runs on the engine's runtime. The adapter converts types and
//! decides nothing.
//!
//! ```
//! use idem_engine::http::{Exchange, HttpGuard, HttpOptions, HttpRequest, HttpResponse};
//! use idem_engine::{Engine, EngineOptions};
//!
//! let engine = Engine::open("memory:", EngineOptions::default())?;
//! let here = engine.here()?;
//! let guard = HttpGuard::new(&here, HttpOptions::default())?;
//! let charge = || HttpRequest {
//!     method: "POST".into(),
//!     target: "/charges".into(),
//!     headers: vec![("idempotency-key".into(), b"order-7".to_vec())],
//!     body: br#"{"amount":100}"#.to_vec(),
//!     ..HttpRequest::default()
//! };
//! let Exchange::Turn(turn) = here.block_on(guard.begin(&here, charge()))? else {
//!     panic!("the first request runs")
//! };
//! let made = HttpResponse { status: 201, body: b"charged".to_vec(), ..HttpResponse::default() };
//! let sent = here.block_on(turn.finish(made))?;
//! assert_eq!((sent.status, sent.body.as_slice()), (201, &b"charged"[..]));
//!
//! let Exchange::Answer(replay) = here.block_on(guard.begin(&here, charge()))? else {
//!     panic!("a retry is answered from the store")
//! };
//! assert_eq!(replay.body, b"charged");
//! assert!(replay.headers.iter().any(|(name, _)| name == "idempotent-replayed"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod message;
mod options;
mod relay;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::Method;
use http_body_util::BodyExt;
use idem_http::IdempotencyService;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tower_layer::Layer;
use tower_service::Service;

pub use message::{HttpRequest, HttpResponse};
pub use options::{webhook, HttpFingerprint, HttpOptions};

use crate::error::EngineError;
use crate::local::Local;
use crate::run::RunContext;
use crate::store::AnyStore;
use relay::{Relay, TurnSlot};

/// The middleware over one engine: built from [`HttpOptions`] once, and
/// again in a forked child.
pub struct HttpGuard {
    options: HttpOptions,
    methods: Vec<Method>,
    built: Mutex<Built>,
}

struct Built {
    local: Arc<Local>,
    service: IdempotencyService<AnyStore, Relay>,
}

impl std::fmt::Debug for HttpGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpGuard")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the middleware made of a request.
#[derive(Debug)]
pub enum Exchange {
    /// Send this: a replay, or idem's refusal (problem+json). The handler
    /// does not run.
    Answer(HttpResponse),
    /// Run the handler, then hand its response to [`Turn::finish`].
    Turn(Turn),
}

type AnswerFuture = Pin<Box<dyn Future<Output = Result<HttpResponse, EngineError>> + Send>>;

/// A request's turn to run: the handler's response is awaited by the
/// layer, which holds the key's lease meanwhile. Dropped without
/// [`finish`](Self::finish), the request ends as the tower layer ends an
/// inner service's error: the key is kept as outcome-unknown.
pub struct Turn {
    context: Option<RunContext>,
    respond: Mutex<Option<oneshot::Sender<HttpResponse>>>,
    answer: Mutex<Option<AnswerFuture>>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl HttpGuard {
    /// The middleware over `local`'s store, its options checked. Refused
    /// over a remote `idem serve`, whose claim API keeps JSON results
    /// only: open the store itself there.
    pub fn new(local: &Arc<Local>, options: HttpOptions) -> Result<Self, EngineError> {
        let built = Built::new(local, &options)?;
        let methods = match &options.methods {
            Some(names) => names
                .iter()
                .filter_map(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).ok())
                .collect(),
            None => vec![Method::POST, Method::PATCH],
        };
        Ok(Self {
            options,
            methods,
            built: Mutex::new(built),
        })
    }

    /// Whether requests with `method` are covered; others need not be
    /// handed over at all.
    pub fn covers(&self, method: &str) -> bool {
        self.methods
            .iter()
            .any(|m| m.as_str().eq_ignore_ascii_case(method))
    }

    /// The layer's service for `local`: built again in a forked child,
    /// whose parent's is left untouched (see [`Engine::here`](crate::Engine::here)).
    fn service(
        &self,
        local: &Arc<Local>,
    ) -> Result<IdempotencyService<AnyStore, Relay>, EngineError> {
        let mut built = self.built.lock();
        if !Arc::ptr_eq(&built.local, local) {
            let fresh = Built::new(local, &self.options)?;
            let old = std::mem::replace(&mut *built, fresh);
            if old.local.pid != std::process::id() {
                std::mem::forget(old);
            }
        }
        Ok(built.service.clone())
    }

    /// Hands `request` to the layer: its answer, or its turn to run. The
    /// layer's work runs on `local`'s runtime, whoever awaits this.
    pub fn begin(
        &self,
        local: &Arc<Local>,
        request: HttpRequest,
    ) -> impl Future<Output = Result<Exchange, EngineError>> + Send + 'static {
        let prepared = self
            .service(local)
            .and_then(|service| Ok((service, request.into_http()?)));
        let local = Arc::clone(local);
        async move {
            let (mut service, mut request) = prepared?;
            let (turn_tx, mut turn_rx) = oneshot::channel();
            request
                .extensions_mut()
                .insert(TurnSlot(Arc::new(Mutex::new(Some(turn_tx)))));
            let task = local.spawn(async move {
                let response = service
                    .call(request)
                    .await
                    .map_err(|e| EngineError::Unexpected(idem::error_chain(&*e)))?;
                let (head, body) = response.into_parts();
                let body = body.collect().await.map_err(|e| {
                    EngineError::Unexpected(format!("the answer could not be read: {e}"))
                })?;
                Ok(HttpResponse::from_http(head, body.to_bytes()))
            });
            let mut answer: AnswerFuture = Box::pin(async move { task.await? });
            tokio::select! {
                turn = &mut turn_rx => match turn {
                    Ok(turn) => Ok(Exchange::Turn(Turn {
                        context: turn.ctx.map(|ctx| RunContext::new(Arc::clone(&local), ctx)),
                        respond: Mutex::new(Some(turn.respond)),
                        answer: Mutex::new(Some(answer)),
                    })),
                    // Answered without a turn: the request went with the
                    // answer.
                    Err(_) => answer.await.map(Exchange::Answer),
                },
                answered = &mut answer => answered.map(Exchange::Answer),
            }
        }
    }
}

impl Built {
    fn new(local: &Arc<Local>, options: &HttpOptions) -> Result<Self, EngineError> {
        let layer = options.layer(local)?;
        Ok(Self {
            local: Arc::clone(local),
            service: layer.layer(Relay),
        })
    }
}

impl Turn {
    /// The run the handler runs under: its fence, lease-lost check and
    /// steps (`None` when the request has no key and passes through
    /// unguarded).
    pub fn context(&self) -> Option<&RunContext> {
        self.context.as_ref()
    }

    /// Hands over the handler's response and resolves with the answer to
    /// send: the response itself (stored, or the key released by the
    /// status table), or idem's refusal when it could not be stored.
    pub fn finish(
        &self,
        response: HttpResponse,
    ) -> impl Future<Output = Result<HttpResponse, EngineError>> + Send + 'static {
        let respond = self.respond.lock().take();
        let answer = self.answer.lock().take();
        async move {
            let (Some(respond), Some(answer)) = (respond, answer) else {
                return Err(EngineError::Config(
                    "the turn was already finished".to_owned(),
                ));
            };
            // The layer stopped waiting only if its run ended: its answer
            // says how.
            let _ = respond.send(response);
            answer.await
        }
    }
}
