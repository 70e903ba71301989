//! One covered request, from its head to the answer: the key, the body and
//! its fingerprint, the scope (all in the client's connection), then the
//! run itself (to its end even if the client goes, see [`Settings::run`])
//! and the mapping of its outcome onto a response ([`answer`]).

mod answer;
mod referenced;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{
    header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri,
};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem::blob::Blobs;
use idem::derive::json::{JsonDoc, JsonKey, JsonKeyError};
use idem::derive::{uuid_v7_age, KeyAge};
use idem::{
    BoxError, FailureClass, Fingerprint, Idempotency, Key, KeyRules, RecordId, Scope, Store,
    Timestamp,
};
use tokio_util::task::TaskTracker;

use crate::body::IdemBody;
use crate::grpc::{self};
use crate::header::parse_key;
use crate::keep::KeepRules;
use crate::rejection::Rejection;
use crate::rules::{FingerprintRule, Hook};
use crate::stored::Responses;
use crate::webhook::Webhook;

/// The header replays carry.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The header a replay of a response stored reduced carries: what was kept
/// (`status-only`, `redacted`), so a client can tell an empty or redacted
/// body from the original's.
pub const REPLAY_KEPT_HEADER: &str = "idempotent-replay-kept";

/// The header every covered response carries: how long, in seconds, a key
/// is remembered after its request completes.
pub const LIFETIME_HEADER: &str = "idempotency-key-lifetime";

/// [`LIFETIME_HEADER`], [`REPLAYED_HEADER`] and [`REPLAY_KEPT_HEADER`] as
/// names: a `&str` key is parsed again at every use.
pub(crate) const LIFETIME: HeaderName = HeaderName::from_static(LIFETIME_HEADER);
pub(crate) const REPLAYED: HeaderName = HeaderName::from_static(REPLAYED_HEADER);
pub(crate) const REPLAY_KEPT: HeaderName = HeaderName::from_static(REPLAY_KEPT_HEADER);

/// RFC 7240's answer to `Prefer`.
const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// How far in the future a UUIDv7 key's time may be (producers' clocks
/// differ).
const UUID_SKEW: Duration = Duration::from_secs(5);

/// A layer's settings, shared by its services and their runs.
pub(crate) struct Settings<S> {
    pub(crate) idem: Idempotency<S, Responses>,
    pub(crate) methods: Vec<Method>,
    pub(crate) header: HeaderName,
    pub(crate) required: bool,
    pub(crate) key_rules: KeyRules,
    pub(crate) tenant: Option<Hook<Option<String>>>,
    pub(crate) route: Option<Hook<String>>,
    pub(crate) fingerprint: FingerprintRule,
    pub(crate) stored: Arc<dyn Fn(StatusCode) -> bool + Send + Sync>,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    /// The most a stored response (head and body, encoded) may take.
    pub(crate) max_stored_bytes: usize,
    pub(crate) retention: Duration,
    pub(crate) lifetime: HeaderValue,
    pub(crate) forward_takeovers: bool,
    pub(crate) reject_old_uuid_v7: bool,
    pub(crate) max_wait: Duration,
    pub(crate) default_wait: Duration,
    /// What each path keeps of its responses for replays.
    pub(crate) keep: KeepRules,
    /// Where bodies kept by reference go.
    pub(crate) blobs: Option<Blobs>,
    /// Stored headers left out of replays.
    pub(crate) replay_drop: Vec<HeaderName>,
    /// Replays carry the time of the replay as `Date`.
    pub(crate) replay_redate: bool,
    /// The field of a gRPC request's message that holds its key when the
    /// header does not (AIP-155 `request_id`).
    pub(crate) grpc_request_id: grpc::RequestIdFields,
    /// Where in a JSON body a request without the key header has its key.
    pub(crate) body_key: Option<JsonKey>,
    /// The webhook sender whose signatures are checked before a claim.
    pub(crate) webhook: Option<Webhook>,
    /// Bodies are MCP tool calls: replays answer the retry's JSON-RPC id.
    pub(crate) mcp: bool,
    /// Asks the service about keys whose outcome is unknown.
    pub(crate) reconciling: Option<crate::reconcile::Reconciling>,
    /// The runs going on now, detached from their connections.
    pub(crate) runs: TaskTracker,
}

/// Why a response was not stored (the executor records it as a failure:
/// retryable releases the key; terminal and unknown close it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unstored {
    #[error("the request may have reached the upstream, but its response was lost")]
    Unknown,
    #[error("the upstream answered {status}, but the response broke off: {error}")]
    BrokeOff { status: StatusCode, error: String },
    #[error("status {0} is not stored; the key was released")]
    Status(StatusCode),
    #[error("gRPC status {0} is not stored; the key was released")]
    GrpcStatus(String),
    #[error(
        "the upstream answered gRPC status {0}: the call was cut off while it may have been \
         acting on it"
    )]
    GrpcCutOff(String),
    #[error("response over the {limit}-byte limit for stored responses (head and body)")]
    TooLarge { limit: usize },
    #[error("the response could not be kept in the blob store: {0}")]
    Unkept(String),
    #[error("the inner service failed before acting on the request: {0}")]
    NotExecuted(String),
    #[error("the inner service failed, after the request was passed to it: {0}")]
    Failed(String),
    #[error(
        "attempt {attempt} found the key's earlier attempt stopped without an outcome (its \
         lease ran out: the process serving it died or was cut off mid-request)"
    )]
    Takeover { attempt: u32 },
}

impl Unstored {
    /// How the executor records it.
    pub(crate) fn class(&self) -> FailureClass {
        match self {
            Self::TooLarge { .. } | Self::Unkept(_) => FailureClass::Terminal,
            Self::Unknown
            | Self::GrpcCutOff(_)
            | Self::BrokeOff { .. }
            | Self::Failed(_)
            | Self::Takeover { .. } => FailureClass::Unknown,
            Self::Status(_) | Self::GrpcStatus(_) | Self::NotExecuted(_) => FailureClass::Retryable,
        }
    }
}

/// Where the body of a request without the key header has its key.
#[derive(Clone, Copy)]
enum BodySource<'a> {
    /// A gRPC message's `request_id` field, by number.
    Grpc(u32),
    /// A JSON body's field, fields or hash of fields.
    Json(&'a JsonKey),
}

/// Where [`Settings::prepare`] leaves a covered request.
pub(crate) enum Step<B> {
    /// Keyed and checked: to be run.
    Run(Prepared<B>),
    /// No key, and none required: passed to the inner service unguarded.
    PassThrough(Request<B>),
    /// Refused; the answer.
    Refused(Response<IdemBody>),
}

/// A covered request, read and checked, ready to run.
pub(crate) struct Prepared<B> {
    id: RecordId,
    fingerprint: Option<Fingerprint>,
    request: Request<B>,
    /// How long to wait for a running duplicate's outcome.
    wait: Duration,
    /// Whether the wait was asked for with `Prefer: wait`.
    preferred: bool,
    /// The JSON-RPC id of an MCP tool call, which its replay answers.
    rpc_id: Option<serde_json::Value>,
}

impl<S: Store> Settings<S> {
    /// Whether `method` is covered.
    pub(crate) fn covers(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }

    /// Whether [`prepare`](Self::prepare) would pass a covered request with
    /// these headers and URI through as it is, before reading its body: no
    /// key header, no key looked for in its body or behind a webhook's
    /// signature, none required, not an MCP call. The service hands such a
    /// request straight to the inner service, without a run's future.
    pub(crate) fn passes_through(&self, headers: &HeaderMap, uri: &Uri) -> bool {
        !self.required
            && !self.mcp
            && self.webhook.is_none()
            && !headers.contains_key(&self.header)
            && self.body_source(headers, uri).is_none()
    }

    /// Reads and checks a covered request. Nothing is claimed yet, so this
    /// may be cut off with the connection.
    pub(crate) async fn prepare<B>(&self, request: Request<B>) -> Step<B>
    where
        B: Body<Data = Bytes> + From<Bytes>,
        B::Error: Into<BoxError>,
    {
        let (mut parts, body) = request.into_parts();
        if self.mcp {
            // A replay is re-addressed to its retry's JSON-RPC id, so the
            // answer must come unencoded.
            parts.headers.remove(header::ACCEPT_ENCODING);
        }
        // A webhook's key is read where its sender signed it, once the
        // signature checks out; any other request's from the key header,
        // else from its body once that is read.
        let in_body = self.body_source(&parts.headers, &parts.uri);
        let key = if self.webhook.is_some() {
            None
        } else {
            match self.key(&parts) {
                Ok(Some(key)) => Some(key),
                Ok(None) if in_body.is_some() => None,
                Ok(None) if self.required => {
                    return Step::Refused(self.reject(self.key_missing(None)))
                }
                Ok(None) => return Step::PassThrough(Request::from_parts(parts, body)),
                Err(rejection) => return Step::Refused(self.reject(rejection)),
            }
        };
        let prepared = async {
            if let Some(key) = &key {
                self.check_age(key)?;
            }
            let body = self.read_body(&parts, body).await?;
            let key = match (&self.webhook, key, in_body) {
                (Some(webhook), _, _) => Some(self.webhook_key(webhook, &parts.headers, &body)?),
                (None, Some(key), _) => Some(key),
                (None, None, Some(source)) => self.key_in_body(&body, source)?,
                (None, None, None) => None,
            };
            let Some(key) = key else {
                return Ok(Err(body));
            };
            let fingerprint = self.fingerprint(&parts, &body)?;
            Ok::<_, Rejection>(Ok((key, body, fingerprint)))
        };
        let (key, body, fingerprint) = match prepared.await {
            Ok(Ok(prepared)) => prepared,
            // No key in the body either, and none required.
            Ok(Err(body)) => return Step::PassThrough(Request::from_parts(parts, B::from(body))),
            Err(rejection) => return Step::Refused(self.reject(rejection)),
        };
        let preferred = preferred_wait(&parts.headers);
        let rpc_id = if self.mcp {
            crate::mcp::request_id(&body)
        } else {
            None
        };
        Step::Run(Prepared {
            rpc_id,
            id: RecordId::new(self.scope(&parts), key),
            fingerprint,
            wait: preferred.unwrap_or(self.default_wait).min(self.max_wait),
            preferred: preferred.is_some(),
            request: Request::from_parts(parts, B::from(body)),
        })
    }

    /// The request's key header's key. `Ok(None)`: there is none.
    fn key(&self, parts: &Parts) -> Result<Option<Key>, Rejection> {
        let mut values = parts.headers.get_all(&self.header).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            let count = parts.headers.get_all(&self.header).iter().count();
            return match count {
                0 => Ok(None),
                count => Err(Rejection::KeyMalformed {
                    detail: format!(
                        "the {} header appears {count} times (rule: exactly once)",
                        self.header
                    ),
                }),
            };
        };
        parse_key(self.header.as_str(), value, &self.key_rules)
            .map(Some)
            .map_err(|e| Rejection::KeyMalformed {
                detail: idem::error_chain(&e),
            })
    }

    /// Where the body of a request without the key header has its key: a
    /// gRPC call's `request_id` field (AIP-155) when one is configured for
    /// its method, a JSON source for any other request.
    fn body_source(&self, headers: &HeaderMap, uri: &Uri) -> Option<BodySource<'_>> {
        if grpc::is_grpc(headers) {
            return self.grpc_request_id.field(uri.path()).map(BodySource::Grpc);
        }
        self.body_key.as_ref().map(BodySource::Json)
    }

    /// The key in the body, its age checked as a header key's is: `None`
    /// when it has none and none is required.
    fn key_in_body(&self, body: &[u8], source: BodySource<'_>) -> Result<Option<Key>, Rejection> {
        let malformed = |detail: String| Rejection::KeyMalformed { detail };
        let key = match source {
            BodySource::Grpc(field) => match grpc::request_id(body, field) {
                Ok(id) => id
                    .map(|id| self.key_rules.parse(&id))
                    .transpose()
                    .map_err(|e| malformed(format!("the request_id (field {field}): {e}")))?,
                Err(why) => {
                    return Err(malformed(format!(
                        "the key was to be read from the message's request_id (field {field}), \
                         but {why}"
                    )))
                }
            },
            // Only an MCP tool call is keyed by its arguments.
            BodySource::Json(_) if self.mcp && !crate::mcp::is_tool_call(body) => None,
            BodySource::Json(source) => {
                match source.read(&mut JsonDoc::new(body), &self.key_rules) {
                    Ok(key) => key,
                    // A body that is not JSON carries no key.
                    Err(JsonKeyError::NotJson { .. }) if !self.required => None,
                    Err(error) => {
                        return Err(malformed(format!(
                            "without an {} header, the key is read from the JSON body, but {error}",
                            self.header
                        )))
                    }
                }
            }
        };
        match key {
            Some(key) => {
                self.check_age(&key)?;
                Ok(Some(key))
            }
            None if self.required => Err(self.key_missing(Some(source))),
            None => Ok(None),
        }
    }

    /// The refusal of a request without a key, naming every place it was
    /// looked for.
    fn key_missing(&self, in_body: Option<BodySource<'_>>) -> Rejection {
        Rejection::KeyMissing {
            header: self.header.clone(),
            body: in_body.map(|source| match source {
                BodySource::Grpc(field) => format!("the request_id (field {field}) of its message"),
                BodySource::Json(source) => format!("the {source} of its JSON body"),
            }),
        }
    }

    /// A webhook's key, read where its sender signed it once the
    /// signature checks out: nothing is claimed for a request that fails.
    fn webhook_key(
        &self,
        webhook: &Webhook,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Result<Key, Rejection> {
        webhook
            .verify(headers, body, Timestamp::now())
            .map_err(|detail| Rejection::BadSignature { detail })?;
        let key = webhook
            .key(headers, body, &self.key_rules)
            .map_err(|detail| Rejection::KeyMalformed { detail })?;
        self.check_age(&key)?;
        Ok(key)
    }

    /// Refuses a UUIDv7 key older than the retention, when configured.
    fn check_age(&self, key: &Key) -> Result<(), Rejection> {
        if !self.reject_old_uuid_v7 {
            return Ok(());
        }
        match uuid_v7_age(key.as_str(), Timestamp::now(), self.retention, UUID_SKEW) {
            Ok(KeyAge::OlderThanRetention { age, retention }) => {
                Err(Rejection::KeyTooOld { age, retention })
            }
            _ => Ok(()),
        }
    }

    async fn read_body<B>(&self, parts: &Parts, body: B) -> Result<Bytes, Rejection>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let limit = self.max_request_bytes;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(declared) = declared.filter(|&n| n > limit as u64) {
            return Err(Rejection::BodyTooLarge {
                size: declared.to_string(),
                limit,
            });
        }
        match Limited::new(body, limit).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                Err(Rejection::BodyTooLarge {
                    size: format!("more than {limit}"),
                    limit,
                })
            }
            Err(error) => Err(Rejection::BadBody {
                detail: format!(
                    "the request body could not be read: {error}. The key was not used"
                ),
            }),
        }
    }

    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Result<Option<Fingerprint>, Rejection> {
        let bad_body = |detail: String| Rejection::BadBody { detail };
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
            let method = parts.method.as_str();
            let mut scope = String::with_capacity(6 + method.len() + route.len() + 40);
            scope.push_str("http ");
            scope.push_str(method);
            scope.push(' ');
            scope.push_str(route);
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

/// The `wait` preference of a request's `Prefer` headers (RFC 7240 §4.3:
/// `wait=N`, N in seconds), if any. Other preferences, and a `wait` whose
/// value is not a number, are ignored.
fn preferred_wait(headers: &http::HeaderMap) -> Option<Duration> {
    const PREFER: HeaderName = HeaderName::from_static("prefer");
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|preference| {
            let token = preference.split(';').next()?;
            let (name, value) = token.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            let value = value.trim().trim_matches('"');
            value.parse::<u64>().ok().map(Duration::from_secs)
        })
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
