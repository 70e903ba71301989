//! The gateway's reconciler (`--reconcile URL`): asks an endpoint of the
//! upstream whether a request whose outcome is unknown took effect
//! ([`idem_http::reconcile`]).
//!
//! The question is `GET URL` with the key in the gateway's key header, the
//! key's scope in `Idem-Scope` (the tenant, if any, and the route), the
//! request's method in `Idem-Method`, its path and query in `Idem-Path`,
//! and its `Authorization` and tenant header (`--tenant-header`), if any:
//! the same key from two tenants is two questions. The upstream answers with
//! `Idempotency-Outcome`:
//!
//! - `applied`: the rest of the answer — status, headers, body — is the
//!   response the request got (or would have got), stored and replayed;
//! - `not-applied`: the key is released and the retry runs;
//! - absent or anything else (or no answer in time): unknown, the key stays
//!   for a person.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{header, HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyExt, Limited};
use idem::{ListQuery, ListRecords, RecordId, State, StateKind};
use idem_http::reconcile::{BoxFinding, Finding, Question, Reconciler, Swept};
use idem_http::strip_hop_by_hop;
use idem_http::IdempotencyLayer;

use crate::store::AnyStore;
use crate::upstream::{self, UpstreamClient, UpstreamProtocol};

/// The header the upstream's answer says what it found in.
pub const OUTCOME_HEADER: HeaderName = HeaderName::from_static("idempotency-outcome");
/// The question's header naming the request's method.
pub const METHOD_HEADER: HeaderName = HeaderName::from_static("idem-method");
/// The question's header naming the request's path and query.
pub const PATH_HEADER: HeaderName = HeaderName::from_static("idem-path");
/// The question's header naming the key's scope.
pub const SCOPE_HEADER: HeaderName = HeaderName::from_static("idem-scope");

/// Asks `GET URL` of the upstream (see [the module](self)).
#[derive(Clone)]
pub struct Probe {
    inner: Arc<Inner>,
}

struct Inner {
    client: UpstreamClient,
    /// The URL's path and query, asked of `client`'s origin.
    target: String,
    key_header: HeaderName,
    tenant_header: Option<HeaderName>,
    max_body: usize,
}

impl Probe {
    /// A probe of `url` (http or https; `protocol`'s CA trusted), sending
    /// the key in `key_header` (and the retry's `tenant_header`, if any)
    /// and reading answers of up to `max_body` bytes.
    pub fn new(
        url: &Uri,
        protocol: &UpstreamProtocol,
        (key_header, tenant_header): (HeaderName, Option<HeaderName>),
        max_body: usize,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            matches!(url.scheme_str(), Some("http" | "https")) && url.authority().is_some(),
            "--reconcile must be an http:// or https:// URL with a host, got {url}"
        );
        let origin: Uri = format!(
            "{}://{}",
            url.scheme_str().unwrap_or("http"),
            url.authority().map_or("", |a| a.as_str())
        )
        .parse()?;
        let protocol = UpstreamProtocol {
            ca_file: protocol.ca_file.clone(),
            http2_only: false,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                client: upstream::client(&origin, &protocol, Duration::from_secs(2))?,
                target: url
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str())
                    .to_owned(),
                key_header,
                tenant_header,
                max_body,
            }),
        })
    }
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("client", &self.inner.client)
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

impl Reconciler for Probe {
    fn reconcile(&self, question: Question) -> BoxFinding {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move { inner.ask(question).await })
    }
}

impl Inner {
    async fn ask(&self, question: Question) -> Finding {
        let request = match self.question(&question) {
            Ok(request) => request,
            Err(why) => return Finding::Unknown(why),
        };
        let response = match self.client.request(request).await {
            Ok(response) => response,
            Err(error) => {
                return Finding::Unknown(format!("the reconcile URL did not answer: {error}"))
            }
        };
        let (mut head, body) = response.into_parts();
        let said = head
            .headers
            .remove(&OUTCOME_HEADER)
            .map(|v| v.to_str().unwrap_or("").trim().to_ascii_lowercase());
        match said.as_deref() {
            Some("applied") => {}
            Some("not-applied") => return Finding::NotApplied,
            Some(other) => {
                return Finding::Unknown(format!(
                    "the reconcile URL answered {} with {OUTCOME_HEADER}: {other:?}",
                    head.status
                ))
            }
            None => {
                return Finding::Unknown(format!(
                    "the reconcile URL answered {} without {OUTCOME_HEADER}",
                    head.status
                ))
            }
        }
        let body = match Limited::new(body, self.max_body).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                return Finding::Unknown(format!(
                    "reading the applied response (at most {} bytes): {error}",
                    self.max_body
                ))
            }
        };
        strip_hop_by_hop(&mut head.headers);
        head.headers.remove(header::CONTENT_LENGTH);
        Finding::Applied(Response::from_parts(head, body))
    }

    /// The question's request.
    fn question(&self, question: &Question) -> Result<Request<Body>, String> {
        let key = HeaderValue::from_str(question.id.key().as_str())
            .map_err(|_| "the key is not a header value".to_owned())?;
        let path = question.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let path = HeaderValue::from_str(path).map_err(|_| "the path is not a header value")?;
        let scope = HeaderValue::from_str(question.id.scope().as_str())
            .map_err(|_| "the scope is not a header value")?;
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(self.target.as_str())
            .header(self.key_header.clone(), key)
            .header(SCOPE_HEADER, scope)
            .header(METHOD_HEADER, question.method.as_str())
            .header(PATH_HEADER, path);
        let passed = std::iter::once(&header::AUTHORIZATION).chain(self.tenant_header.as_ref());
        for name in passed {
            if let Some(value) = question.headers.get(name) {
                request = request.header(name, value.clone());
            }
        }
        request
            .body(Body::empty())
            .map_err(|e| format!("building the question: {e}"))
    }
}

/// How many parked keys one sweep asks about at most.
pub const SWEEP_BATCH: usize = 100;

/// Sweeps `store` every `every` for keys the gateway's `layer` parked
/// with an unknown outcome and asks its reconciler about each
/// ([`IdempotencyLayer::reconcile_parked`]), up to [`SWEEP_BATCH`] a
/// sweep; the next sweep goes on after the last key asked, so keys the
/// upstream cannot settle do not hold the others back. Stops when the
/// handle is dropped.
pub fn spawn_sweep(
    store: AnyStore,
    layer: IdempotencyLayer<AnyStore>,
    every: Duration,
) -> tokio_util::task::AbortOnDropHandle<()> {
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut after = None;
        loop {
            tick.tick().await;
            match sweep(&store, &layer, after.take()).await {
                Ok((next, tally)) => {
                    after = next;
                    if tally.asked > 0 {
                        tracing::info!(
                            asked = tally.asked,
                            settled = tally.settled,
                            "swept keys whose outcome is unknown"
                        );
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %format!("{error:#}"), "sweep for outcomes unknown")
                }
            }
        }
    }))
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Keys asked about.
    pub asked: usize,
    /// Of those, settled.
    pub settled: usize,
}

/// One sweep from `after` (the start when `None`): failed records read a
/// page at a time, the gateway's parked ones asked about until
/// [`SWEEP_BATCH`] were; where the next sweep goes on (`None`: from the
/// start).
pub async fn sweep(
    store: &AnyStore,
    layer: &IdempotencyLayer<AnyStore>,
    mut after: Option<RecordId>,
) -> anyhow::Result<(Option<RecordId>, Tally)> {
    let mut tally = Tally::default();
    loop {
        let mut query = ListQuery::new(SWEEP_BATCH);
        query.state = Some(StateKind::Failed);
        query.after = after.take();
        let page = store.list(&query).await?;
        for (id, record) in &page.records {
            let State::Failed { failure } = &record.state else {
                continue;
            };
            if !failure.is_parked() {
                continue;
            }
            match layer.reconcile_parked(id).await {
                Swept::Settled => tally.settled += 1,
                Swept::Unsettled => {}
                Swept::NotAsked => continue,
            }
            tally.asked += 1;
            if tally.asked == SWEEP_BATCH {
                return Ok((Some(id.clone()), tally));
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok((None, tally)),
        }
    }
}
