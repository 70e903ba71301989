//! The tower layer and service.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem::{
    BoxError, ConfigError, FailureClass, Fingerprint, Idempotency, Key, KeyRules, Outcome,
    RecordId, RunError, Scope, Store,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::IdemBody;
use crate::header::parse_key;
use crate::problem::{types, Problem};
use crate::stored::{Binary, StoredResponse};

/// The header replays carry.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The header every covered response carries: how long, in seconds, a key
/// is remembered after its request completes.
pub const LIFETIME_HEADER: &str = "idempotency-key-lifetime";

/// A marker an inner service sets on its own error response (as a
/// response extension) when the request may have reached the upstream but
/// the upstream's response was lost: a timeout after the request was sent,
/// a connection reset mid-response. The layer then does not release the
/// key (a retry could run the request a second time): it records the key
/// as failed with an unknown outcome, passes this response on, and answers
/// later requests with that key 422 `outcome-unknown` until an operator
/// checks the upstream and releases the key (`idem release SCOPE KEY`).
/// The `idem proxy` gateway sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeUnknown;

/// The longest `Retry-After` a 409 advises.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(1);

type Hook<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;

/// A custom fingerprint of the request head and body.
pub type FingerprintHook = Arc<dyn Fn(&Parts, &[u8]) -> Result<Fingerprint, String> + Send + Sync>;

/// What the fingerprint of a request covers. A key reused with a different
/// fingerprint gets 422.
#[derive(Clone)]
#[non_exhaustive]
pub enum FingerprintRule {
    /// Method, path, query and body (default). A JSON body (by
    /// `Content-Type`) is canonicalised first, so key order and whitespace
    /// do not matter; any other body is taken byte for byte.
    Request,
    /// Method and path, plus only these JSON-pointer fields of the body
    /// (`/amount`, `/customer/id`). A body that is not JSON is refused
    /// with 400.
    JsonFields(Vec<String>),
    /// Your own digest of the request head and body; an `Err` is answered
    /// with 400 and the message as the detail.
    Custom(FingerprintHook),
    /// No fingerprint: any request under a used key gets the stored answer.
    Off,
}

impl std::fmt::Debug for FingerprintRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Request => f.write_str("Request"),
            Self::JsonFields(fields) => f.debug_tuple("JsonFields").field(fields).finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
            Self::Off => f.write_str("Off"),
        }
    }
}

/// Which statuses are stored by default: 2xx, and 4xx except 408, 409,
/// 425 and 429 (the client may rightly retry those). Anything else
/// releases the key, so a retry runs again.
pub fn default_stored(status: StatusCode) -> bool {
    status.is_success()
        || (status.is_client_error() && !matches!(status.as_u16(), 408 | 409 | 425 | 429))
}

/// Configures an [`IdempotencyLayer`]; [`IdempotencyLayer::builder`] has
/// the defaults.
pub struct IdempotencyLayerBuilder<S> {
    store: S,
    methods: Vec<Method>,
    header: HeaderName,
    required: bool,
    key_rules: KeyRules,
    tenant: Option<Hook<Option<String>>>,
    route: Option<Hook<String>>,
    fingerprint: FingerprintRule,
    stored: Arc<dyn Fn(StatusCode) -> bool + Send + Sync>,
    max_request_bytes: usize,
    max_response_bytes: usize,
    retention: Duration,
    lease: Duration,
    fail_open: bool,
}

impl<S: Store> IdempotencyLayerBuilder<S> {
    /// The methods covered (default POST and PATCH); others pass through
    /// untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The key header (default `Idempotency-Key`).
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// Whether a covered request without a key is refused with 400
    /// (`true`) or passed through unguarded (`false`, the default).
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// The key rules (default: 1..=255 bytes of visible ASCII).
    pub fn key_rules(mut self, rules: KeyRules) -> Self {
        self.key_rules = rules;
        self
    }

    /// A tenant discriminator taken from the request head: requests of two
    /// tenants never share a record, so no client can replay another's
    /// response. The value is hashed into the scope, so it may be a secret
    /// (an `Authorization` header). `None` puts the request in an
    /// "anonymous" tenant.
    pub fn tenant(
        mut self,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.tenant = Some(Arc::new(tenant));
        self
    }

    /// The tenant is the value of `header` (all of its values, in order).
    pub fn tenant_header(self, header: HeaderName) -> Self {
        self.tenant(move |parts| {
            let values: Vec<&[u8]> = parts
                .headers
                .get_all(&header)
                .iter()
                .map(HeaderValue::as_bytes)
                .collect();
            (!values.is_empty()).then(|| hex::encode(values.join(&b'\n')))
        })
    }

    /// The route part of the scope (default: axum's matched route template
    /// when the `axum` feature is on and one is present, else the path).
    pub fn route(mut self, route: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.route = Some(Arc::new(route));
        self
    }

    /// What the fingerprint covers (default [`FingerprintRule::Request`]).
    pub fn fingerprint(mut self, rule: FingerprintRule) -> Self {
        self.fingerprint = rule;
        self
    }

    /// Which response statuses are stored and replayed (default
    /// [`default_stored`]); the others release the key.
    pub fn store_status(
        mut self,
        stored: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.stored = Arc::new(stored);
        self
    }

    /// The largest request body accepted on covered methods (default
    /// 1 MiB); larger ones get 413 and the key is not used.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger one is
    /// still sent to the client that caused it, but the key is then closed
    /// for good: later requests under it get 422.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// How long a completed key is remembered (default 24 h); advertised
    /// on every covered response in `Idempotency-Key-Lifetime`.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long a claim lasts without a heartbeat (default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// When the store cannot be reached: refuse with 503 (`false`, the
    /// default) or pass the request through unguarded (`true`).
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(self) -> Result<IdempotencyLayer<S>, ConfigError> {
        let idem = Idempotency::builder(self.store)
            .codec(Binary)
            .lease(self.lease)
            .retention(self.retention)
            .fail_open(self.fail_open)
            // The client decides whether to retry a 5xx, however often.
            .max_attempts(NonZeroU32::MAX)
            // Room for the head around the largest body.
            .max_response_bytes(self.max_response_bytes.saturating_add(64 * 1024))
            .classify(|error| match error.downcast_ref::<Unstored>() {
                Some(Unstored::TooLarge { .. }) => FailureClass::Terminal,
                Some(Unstored::Unknown | Unstored::BrokeOff { .. }) => FailureClass::Unknown,
                _ => FailureClass::Retryable,
            })
            .build()?;
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                idem,
                methods: self.methods,
                header: self.header,
                required: self.required,
                key_rules: self.key_rules,
                tenant: self.tenant,
                route: self.route,
                fingerprint: self.fingerprint,
                stored: self.stored,
                max_request_bytes: self.max_request_bytes,
                max_response_bytes: self.max_response_bytes,
                lifetime: HeaderValue::from(self.retention.as_secs()),
            }),
        })
    }
}

/// A tower [`Layer`] giving covered requests `Idempotency-Key` semantics
/// (DESIGN §8): one execution per key, stored responses replayed byte for
/// byte, problem+json answers for everything else.
pub struct IdempotencyLayer<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for IdempotencyLayer<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Store> IdempotencyLayer<S> {
    /// Starts configuring a layer over `store`. Defaults: POST and PATCH
    /// covered, `Idempotency-Key` optional, fingerprint of method, path,
    /// query and body, 2xx and most 4xx stored, 1 MiB request and response
    /// limits, 24 h retention, 30 s leases, fail-closed.
    pub fn builder(store: S) -> IdempotencyLayerBuilder<S> {
        IdempotencyLayerBuilder {
            store,
            methods: vec![Method::POST, Method::PATCH],
            header: HeaderName::from_static("idempotency-key"),
            required: false,
            key_rules: KeyRules::default(),
            tenant: None,
            route: None,
            fingerprint: FingerprintRule::Request,
            stored: Arc::new(default_stored),
            max_request_bytes: 1 << 20,
            max_response_bytes: 1 << 20,
            retention: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(30),
            fail_open: false,
        }
    }
}

impl<S, I> Layer<I> for IdempotencyLayer<S> {
    type Service = IdempotencyService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        IdempotencyService {
            shared: Arc::clone(&self.shared),
            inner,
        }
    }
}

/// The service made by [`IdempotencyLayer`].
pub struct IdempotencyService<S, I> {
    shared: Arc<Shared<S>>,
    inner: I,
}

impl<S, I: Clone> Clone for IdempotencyService<S, I> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            inner: self.inner.clone(),
        }
    }
}

struct Shared<S> {
    idem: Idempotency<S, Binary>,
    methods: Vec<Method>,
    header: HeaderName,
    required: bool,
    key_rules: KeyRules,
    tenant: Option<Hook<Option<String>>>,
    route: Option<Hook<String>>,
    fingerprint: FingerprintRule,
    stored: Arc<dyn Fn(StatusCode) -> bool + Send + Sync>,
    max_request_bytes: usize,
    max_response_bytes: usize,
    lifetime: HeaderValue,
}

/// Why a response was not stored (the executor records it as a failure:
/// retryable releases the key; terminal and unknown close it).
#[derive(Debug, thiserror::Error)]
enum Unstored {
    #[error("the request may have reached the upstream, but its response was lost")]
    Unknown,
    #[error("the upstream answered {status}, but the response broke off: {error}")]
    BrokeOff { status: StatusCode, error: String },
    #[error("status {0} is not stored; the key was released")]
    Status(StatusCode),
    #[error("response body over the {limit}-byte limit for stored responses")]
    TooLarge { limit: usize },
    #[error("upstream failed: {0}")]
    Upstream(String),
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, I, B, RB> Service<Request<B>> for IdempotencyService<S, I>
where
    S: Store,
    I: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    I::Future: Send,
    I::Error: std::fmt::Display + Send,
    B: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<IdemBody>;
    type Error = I::Error;
    type Future = BoxFuture<Result<Response<IdemBody>, I::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { shared.handle(request, inner).await })
    }
}

fn bytes_response(response: Response<Bytes>) -> Response<IdemBody> {
    response.map(IdemBody::full)
}

impl<S: Store> Shared<S> {
    async fn handle<I, B, RB>(
        &self,
        request: Request<B>,
        mut inner: I,
    ) -> Result<Response<IdemBody>, I::Error>
    where
        I: Service<Request<B>, Response = Response<RB>> + Send,
        I::Future: Send,
        I::Error: std::fmt::Display,
        B: Body<Data = Bytes> + From<Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        if !self.methods.contains(request.method()) {
            return Ok(inner.call(request).await?.map(IdemBody::new));
        }
        let (parts, body) = request.into_parts();
        let key = match self.key(&parts) {
            Ok(Some(key)) => key,
            Ok(None) => {
                let request = Request::from_parts(parts, body);
                return Ok(inner.call(request).await?.map(IdemBody::new));
            }
            Err(problem) => return Ok(self.problem(problem)),
        };
        let prepared = async {
            let body = self.read_body(&parts, body).await?;
            let fingerprint = self.fingerprint(&parts, &body)?;
            Ok::<_, Problem>((body, fingerprint))
        };
        let (body, fingerprint) = match prepared.await {
            Ok(prepared) => prepared,
            Err(problem) => return Ok(self.problem(problem)),
        };
        let id = RecordId::new(self.scope(&parts), key);
        let request = Request::from_parts(parts, B::from(body));
        // A response that is not stored goes back to its own client as it
        // came; it waits here while the executor records the failure.
        let unstored: Mutex<Option<Response<IdemBody>>> = Mutex::new(None);
        let keep = |response: Response<IdemBody>| {
            *unstored
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(response);
        };
        let result = self
            .idem
            .run(&id, fingerprint, |_ctx| async {
                let response = match inner.call(request).await {
                    Ok(response) => response,
                    Err(error) => return Err(Unstored::Upstream(error.to_string())),
                };
                let (head, body) = response.into_parts();
                if head.extensions.get::<OutcomeUnknown>().is_some() {
                    keep(Response::from_parts(head, IdemBody::new(body)));
                    return Err(Unstored::Unknown);
                }
                if !(self.stored)(head.status) {
                    keep(Response::from_parts(head.clone(), IdemBody::new(body)));
                    return Err(Unstored::Status(head.status));
                }
                match read_up_to(Box::pin(body), self.max_response_bytes).await {
                    Read::All(bytes) => Ok(StoredResponse::new(head.status, head.headers, bytes)),
                    Read::Over { prefix, rest } => {
                        keep(Response::from_parts(head, IdemBody::chain(prefix, rest)));
                        Err(Unstored::TooLarge {
                            limit: self.max_response_bytes,
                        })
                    }
                    Read::Failed(error) => Err(Unstored::BrokeOff {
                        status: head.status,
                        error: error.to_string(),
                    }),
                }
            })
            .await;
        let kept = unstored
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(self.finish(self.answer(result, kept)))
    }

    /// Adds the lifetime header to a covered response.
    fn finish(&self, mut response: Response<IdemBody>) -> Response<IdemBody> {
        response
            .headers_mut()
            .insert(LIFETIME_HEADER, self.lifetime.clone());
        response
    }

    fn answer(
        &self,
        result: Result<Outcome<StoredResponse>, RunError<Unstored>>,
        kept: Option<Response<IdemBody>>,
    ) -> Response<IdemBody> {
        let replayed = matches!(result, Ok(Outcome::Replayed { .. }));
        let problem = match result {
            Ok(outcome) => {
                return match outcome.into_value().to_response() {
                    Ok(mut response) => {
                        if replayed {
                            response
                                .headers_mut()
                                .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
                        }
                        bytes_response(response)
                    }
                    Err(reason) => bytes_response(unreadable(&reason).into_response()),
                };
            }
            Err(RunError::Handler { error, .. }) => match (error, kept) {
                (
                    Unstored::Status(_) | Unstored::TooLarge { .. } | Unstored::Unknown,
                    Some(response),
                ) => return response,
                (error @ (Unstored::BrokeOff { .. } | Unstored::Unknown), _) => Problem::new(
                    StatusCode::BAD_GATEWAY,
                    types::OUTCOME_UNKNOWN,
                    "Upstream outcome unknown",
                    format!(
                        "{error}; it may have been processed, so the key is kept and will \
                             not run it again: check the upstream, then release the key to \
                             allow a retry"
                    ),
                ),
                (error, _) => Problem::new(
                    StatusCode::BAD_GATEWAY,
                    types::UPSTREAM,
                    "Upstream unavailable",
                    format!("{error}; the key was released, so the request may be retried"),
                ),
            },
            Err(RunError::InProgress { retry_after }) => Problem::new(
                StatusCode::CONFLICT,
                types::IN_PROGRESS,
                "Request in progress",
                "a request with this key is still being processed; retry after the \
                 Retry-After delay to get its response",
            )
            // The store's answer is when the other claim's lease runs out,
            // the worst case; most requests finish well before that.
            .retry_after(retry_after.min(MAX_RETRY_AFTER)),
            Err(RunError::Mismatch) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                types::MISMATCH,
                "Key reused with a different request",
                "this key was already used with a different request (method, path, query or \
                 body); use a new key for a new request",
            ),
            Err(RunError::Failed(failure)) if failure.is_parked() => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                types::OUTCOME_UNKNOWN,
                "Outcome of this key unknown",
                format!(
                    "an earlier request with this key may have been processed, but its \
                     response was lost ({}); it will not run again under this key until an \
                     operator checks the upstream and releases the key",
                    failure.message
                ),
            ),
            Err(RunError::Failed(failure)) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                types::NOT_STORED,
                "Response not stored",
                format!(
                    "a request with this key was executed but its response could not be \
                     stored ({}); it will not run again under this key",
                    failure.message
                ),
            ),
            Err(RunError::Store(error)) => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                types::STORE_UNAVAILABLE,
                "Idempotency store unavailable",
                format!("the idempotency store could not be used ({error}); nothing was executed"),
            )
            .retry_after(Duration::from_secs(1)),
            Err(RunError::LeaseLost) => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                types::STORE_UNAVAILABLE,
                "Outcome not recorded",
                "the request ran, but its claim was taken over before the response was \
                 stored; retry to get the stored outcome",
            )
            .retry_after(Duration::from_secs(1)),
            Err(RunError::Decode { reason }) => unreadable(&reason),
            Err(error) => Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                types::NOT_STORED,
                "Response not stored",
                format!("the request ran but its response could not be stored: {error}"),
            ),
        };
        bytes_response(problem.into_response())
    }

    /// The request's key. `Ok(None)`: no key and none required, so the
    /// request passes through.
    fn key(&self, parts: &Parts) -> Result<Option<Key>, Problem> {
        let mut values = parts.headers.get_all(&self.header).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            let count = parts.headers.get_all(&self.header).iter().count();
            return match count {
                0 if !self.required => Ok(None),
                0 => Err(Problem::new(
                    StatusCode::BAD_REQUEST,
                    types::KEY_MISSING,
                    "Idempotency key missing",
                    format!(
                        "this endpoint requires an {} header (a unique value per request, \
                         e.g. a UUID)",
                        self.header
                    ),
                )),
                count => Err(malformed(format!(
                    "the {} header appears {count} times (rule: exactly once)",
                    self.header
                ))),
            };
        };
        parse_key(self.header.as_str(), value, &self.key_rules)
            .map(Some)
            .map_err(|e| malformed(e.to_string()))
    }

    fn problem(&self, problem: Problem) -> Response<IdemBody> {
        self.finish(bytes_response(problem.into_response()))
    }

    async fn read_body<B>(&self, parts: &Parts, body: B) -> Result<Bytes, Problem>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let limit = self.max_request_bytes;
        let too_large = |size: &str| {
            Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                types::BODY_TOO_LARGE,
                "Request body too large",
                format!(
                    "the request body is {size} bytes; the limit is {limit} bytes. The key was \
                     not used"
                ),
            )
        };
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(declared) = declared.filter(|&n| n > limit as u64) {
            return Err(too_large(&declared.to_string()));
        }
        match Limited::new(body, limit).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                Err(too_large(&format!("more than {limit}")))
            }
            Err(error) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                types::BAD_BODY,
                "Request body unreadable",
                format!("the request body could not be read: {error}. The key was not used"),
            )),
        }
    }

    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Result<Option<Fingerprint>, Problem> {
        let bad_body = |detail: String| {
            Problem::new(
                StatusCode::BAD_REQUEST,
                types::BAD_BODY,
                "Request body cannot be fingerprinted",
                detail,
            )
        };
        // Selected fields identify the request without its query string.
        let mut target = parts
            .uri
            .path_and_query()
            .map_or(parts.uri.path(), |pq| pq.as_str());
        let body_digest = match &self.fingerprint {
            FingerprintRule::Off => return Ok(None),
            FingerprintRule::Custom(hook) => {
                return hook(parts, body).map(Some).map_err(bad_body);
            }
            FingerprintRule::Request => {
                if is_json(parts) {
                    Fingerprint::of_json(body).unwrap_or_else(|_| Fingerprint::of_bytes(body))
                } else {
                    Fingerprint::of_bytes(body)
                }
            }
            FingerprintRule::JsonFields(fields) => {
                target = parts.uri.path();
                Fingerprint::of_json_fields(body, fields).map_err(|e| {
                    bad_body(format!(
                        "the fingerprint uses JSON fields of the body, but the body cannot be \
                         read as JSON: {e}"
                    ))
                })?
            }
        };
        let mut framed = Vec::with_capacity(target.len() + 48);
        framed.extend_from_slice(parts.method.as_str().as_bytes());
        framed.push(0);
        framed.extend_from_slice(target.as_bytes());
        framed.push(0);
        framed.extend_from_slice(body_digest.as_bytes());
        Ok(Some(Fingerprint::of_bytes(&framed)))
    }

    /// `http METHOD ROUTE[ tenant:HASH]`; a route too long for a scope is
    /// replaced by its hash.
    fn scope(&self, parts: &Parts) -> Scope {
        let route = match &self.route {
            Some(hook) => hook(parts),
            None => default_route(parts),
        };
        let tenant = self.tenant.as_ref().map(|hook| {
            hook(parts).map_or_else(
                || "anonymous".to_owned(),
                |t| Fingerprint::of_bytes(t.as_bytes()).to_hex()[..32].to_owned(),
            )
        });
        let build = |route: &str| {
            let mut scope = format!("http {} {route}", parts.method);
            if let Some(tenant) = &tenant {
                scope.push_str(" tenant:");
                scope.push_str(tenant);
            }
            Scope::new(&scope)
        };
        build(&route).unwrap_or_else(|_| {
            let hashed = format!(
                "sha256:{}",
                Fingerprint::of_bytes(route.as_bytes()).to_hex()
            );
            build(&hashed).expect("a hashed route always makes a valid scope")
        })
    }
}

fn unreadable(reason: &str) -> Problem {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        types::STORED_UNREADABLE,
        "Stored response unreadable",
        format!("the stored response for this key could not be read: {reason}"),
    )
}

fn malformed(detail: String) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        types::KEY_MALFORMED,
        "Idempotency key malformed",
        detail,
    )
}

fn is_json(parts: &Parts) -> bool {
    parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json" || mime.ends_with("+json")
        })
        .unwrap_or(false)
}

#[cfg(feature = "axum")]
fn default_route(parts: &Parts) -> String {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| parts.uri.path().to_owned(), |m| m.as_str().to_owned())
}

#[cfg(not(feature = "axum"))]
fn default_route(parts: &Parts) -> String {
    parts.uri.path().to_owned()
}

enum Read<B> {
    All(Bytes),
    Over { prefix: Bytes, rest: B },
    Failed(BoxError),
}

/// Reads `body` whole if it is at most `limit` bytes; otherwise stops
/// past the limit and hands back what was read and the rest.
async fn read_up_to<B>(mut body: B, limit: usize) -> Read<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > limit {
                        return Read::Over {
                            prefix: buf.freeze(),
                            rest: body,
                        };
                    }
                }
            }
            Err(error) => return Read::Failed(error.into()),
        }
    }
    Read::All(buf.freeze())
}
