//! `HttpGuard` and `Turn`: the `Idempotency-Key` middleware of
//! [`idem_engine::http`] for the package's Express and Fastify adapters,
//! which hand over requests as `{ method, target, headers, body }` and get
//! back `{ status, headers, body }` or the request's turn to run.

use std::sync::Arc;

use idem_engine::http::{self, Exchange, HttpFingerprint, HttpGuard as Guard, HttpOptions};
use idem_engine::http::{HttpRequest, HttpResponse};
use idem_engine::input::{self, Unit};
use idem_engine::{EngineError, Local};
use napi::bindgen_prelude::{Buffer, Either, PromiseRaw};
use napi::Env;
use napi_derive::napi;

use crate::context::Context;
use crate::engine::Engine;
use crate::errors::to_js;
use crate::promise::promise;

/// How the middleware treats requests; unset: the tower layer's defaults.
#[napi(object)]
pub struct GuardOptions {
    /// The methods covered (default POST and PATCH).
    pub methods: Option<Vec<String>>,
    /// The key header (default Idempotency-Key).
    pub header: Option<String>,
    /// Whether a covered request without a key is refused with 400.
    pub required: Option<bool>,
    /// "request" (default), "off", or the JSON pointers fingerprinted.
    pub fingerprint: Option<Either<String, Vec<String>>>,
    /// Whether keys are scoped per tenant (each request names its own).
    pub tenant: Option<bool>,
    /// The largest request body read, in bytes.
    pub max_request_bytes: Option<u32>,
    /// The largest response stored, in bytes.
    pub max_response_bytes: Option<u32>,
    /// The longest a duplicate in flight waits with `Prefer: wait`.
    pub max_wait_ms: Option<f64>,
    /// How long a duplicate in flight waits without it.
    pub default_wait_ms: Option<f64>,
    /// Whether a key whose earlier attempt died mid-request runs again.
    pub forward_takeovers: Option<bool>,
    /// Whether UUIDv7 keys older than the retention are refused.
    pub reject_old_uuid_v7: Option<bool>,
    /// What is stored of responses for replays (the gateway's `--keep`).
    pub keep: Option<String>,
    /// Where bodies kept by `reference` go (the gateway's `--blobs`).
    pub blobs: Option<String>,
    /// Where a request without the key header has its key in its JSON
    /// body (the gateway's `--key-in-body`: "/id", "fields:/a,/b").
    pub key_in_body: Option<String>,
    /// A webhook sender whose signatures are checked before a claim:
    /// "standard", "stripe" or "github" (the gateway's `--webhook`).
    pub webhook: Option<String>,
    /// The webhook sender's signing secret.
    pub webhook_secret: Option<String>,
    /// Serve MCP tool calls keyed by this tool argument (the gateway's
    /// `--mcp`).
    pub mcp: Option<String>,
}

/// A request as the adapter hands it over.
#[napi(object)]
pub struct Request {
    /// The method.
    pub method: String,
    /// The path and query.
    pub target: String,
    /// Header names and values, alternating (Node's `rawHeaders`).
    pub headers: Vec<String>,
    /// The whole body.
    pub body: Buffer,
    /// The verified caller, when keys are scoped per tenant.
    pub tenant: Option<String>,
}

/// An answer: the handler's response, a replay, or idem's own.
#[napi(object)]
pub struct Answer {
    /// The status code.
    pub status: u32,
    /// Header names and values, alternating.
    pub headers: Vec<String>,
    /// The whole body.
    pub body: Buffer,
}

/// The middleware over an engine; see the package's `idempotency`.
#[napi]
pub struct HttpGuard {
    engine: Arc<idem_engine::Engine>,
    guard: Arc<Guard>,
}

/// A request's turn to run: its run's `context`, and `finish` for the
/// handler's response.
#[napi]
pub struct Turn {
    local: Arc<Local>,
    turn: Arc<idem_engine::http::Turn>,
}

/// A header line's text as Node holds it (latin-1) and as bytes.
fn latin1(text: String) -> Vec<u8> {
    if text.chars().all(|c| u32::from(c) < 256) {
        text.chars().map(|c| c as u8).collect()
    } else {
        text.into_bytes()
    }
}

fn text(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

fn pairs(flat: Vec<String>) -> Vec<(String, Vec<u8>)> {
    let mut lines = Vec::with_capacity(flat.len() / 2);
    let mut flat = flat.into_iter();
    while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
        lines.push((name, latin1(value)));
    }
    lines
}

fn answer(response: HttpResponse) -> Answer {
    Answer {
        status: u32::from(response.status),
        headers: response
            .headers
            .iter()
            .flat_map(|(name, value)| [name.clone(), text(value)])
            .collect(),
        body: response.body.into(),
    }
}

fn options(given: GuardOptions) -> Result<HttpOptions, EngineError> {
    Ok(HttpOptions {
        methods: given.methods,
        header: given.header,
        required: given.required.unwrap_or(false),
        fingerprint: match given.fingerprint {
            None => HttpFingerprint::default(),
            Some(Either::A(name)) => name.parse()?,
            Some(Either::B(fields)) => HttpFingerprint::JsonFields(fields),
        },
        tenant: given.tenant.unwrap_or(false),
        max_request_bytes: given.max_request_bytes.map(|n| n as usize),
        max_response_bytes: given.max_response_bytes.map(|n| n as usize),
        max_wait: input::duration("maxWaitMs", given.max_wait_ms, Unit::Millis)?,
        default_wait: input::duration("defaultWaitMs", given.default_wait_ms, Unit::Millis)?,
        forward_takeovers: given.forward_takeovers.unwrap_or(false),
        reject_old_uuid_v7: given.reject_old_uuid_v7.unwrap_or(false),
        keep: given.keep,
        blobs: given.blobs,
        key_in_body: given.key_in_body,
        webhook: http::webhook(given.webhook.as_deref(), given.webhook_secret.as_deref())?,
        mcp: given.mcp,
    })
}

#[napi]
impl HttpGuard {
    /// The middleware over `engine`'s store.
    #[napi(constructor)]
    pub fn new(engine: &Engine, options: Option<GuardOptions>) -> napi::Result<Self> {
        let options = options
            .map(self::options)
            .transpose()
            .map_err(to_js)?
            .unwrap_or_default();
        let engine = engine.shared();
        let local = engine.here().map_err(to_js)?;
        let guard = Guard::new(&local, options).map_err(to_js)?;
        Ok(Self {
            engine,
            guard: Arc::new(guard),
        })
    }

    /// Whether requests with `method` are covered.
    #[napi]
    pub fn covers(&self, method: String) -> bool {
        self.guard.covers(&method)
    }

    /// Hands a request over: the answer to send, or a `Turn` to run the
    /// handler in.
    #[napi]
    pub fn begin<'env>(
        &self,
        env: &'env Env,
        request: Request,
    ) -> napi::Result<PromiseRaw<'env, Either<Answer, Turn>>> {
        let local = self.engine.here().map_err(to_js)?;
        let work = self.guard.begin(
            &local,
            HttpRequest {
                method: request.method,
                target: request.target,
                headers: pairs(request.headers),
                body: request.body.to_vec(),
                route: None,
                tenant: request.tenant,
            },
        );
        let held = Arc::clone(&local);
        promise(env, &local, work, move |exchange| {
            Ok(match exchange {
                Exchange::Answer(response) => Either::A(answer(response)),
                Exchange::Turn(turn) => Either::B(Turn {
                    local: held,
                    turn: Arc::new(turn),
                }),
            })
        })
    }
}

#[napi]
impl Turn {
    /// The run the handler runs under, or `null` when the request has no
    /// key and passes through unguarded.
    #[napi(getter)]
    pub fn context(&self) -> Option<Context> {
        self.turn.context().cloned().map(Context::new)
    }

    /// Hands over the handler's response; resolves with the answer to
    /// send.
    #[napi]
    pub fn finish<'env>(
        &self,
        env: &'env Env,
        response: Answer,
    ) -> napi::Result<PromiseRaw<'env, Answer>> {
        let status = u16::try_from(response.status).map_err(|_| {
            to_js(EngineError::Config(format!(
                "the handler's status {} is not an HTTP status",
                response.status
            )))
        })?;
        let work = self.turn.finish(HttpResponse {
            status,
            headers: pairs(response.headers),
            body: response.body.to_vec(),
        });
        promise(env, &self.local, work, |response| Ok(answer(response)))
    }
}
