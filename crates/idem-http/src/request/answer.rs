//! The run of a covered request, in a task of its own, and the mapping
//! of its outcome onto a response: stored, replayed, or a problem.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use idem::{BoxError, Context, FailureClass, Outcome, RecordId, RunError, Store};
use tower_service::Service;

use crate::body::IdemBody;
use crate::grpc::{self, Verdict};
use crate::marker::{is_not_executed, OutcomeUnknown};
use crate::reconcile::{settled_response, Question};
use crate::rejection::Rejection;
use crate::stored::{strip_hop_by_hop, Kept, StoredResponse};

use super::{Prepared, Settings, Unstored, LIFETIME, PREFERENCE_APPLIED, REPLAYED, REPLAY_KEPT};

impl<S: Store> Settings<S> {
    /// Runs a prepared request through the executor: claim, the inner
    /// service under the lease's heartbeat, the response stored or the key
    /// released. This is the part that runs to its end when the client goes.
    pub(crate) async fn run<I, B, RB>(
        &self,
        prepared: Prepared<B>,
        mut inner: I,
    ) -> Response<IdemBody>
    where
        I: Service<Request<B>, Response = Response<RB>>,
        I::Error: Into<BoxError>,
        B: Send + 'static,
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        let Prepared {
            id,
            fingerprint,
            request,
            wait,
            preferred,
            rpc_id,
        } = prepared;
        // A response that is not stored goes back to its own client as it
        // came; it waits here while the executor records the failure. One
        // stored waits here too, whole (a route's policy may store it
        // reduced), for its client once the record is written.
        let unstored: Mutex<Option<Response<IdemBody>>> = Mutex::new(None);
        let keep = |response: Response<IdemBody>| {
            *unstored.lock().unwrap_or_else(PoisonError::into_inner) = Some(response);
        };
        let policy = self.keep.for_path(request.uri().path());
        // Under `reference`, a body over the threshold goes to the blob
        // store instead of the record.
        let threshold = policy
            .reference_threshold()
            .filter(|_| self.blobs.is_some());
        let inline = threshold.map_or(self.max_response_bytes, |t| t.min(self.max_response_bytes));
        let executed = AtomicBool::new(false);
        let settled = AtomicBool::new(false);
        // The request waits here until the handler runs: a run that finds
        // its key parked leaves it for the reconciler's question and the
        // run after.
        let slot = Mutex::new(Some(request));
        let mut reconciled = false;
        let result = loop {
            let result = self
                .idem
                .run_waiting(&id, fingerprint, Some(wait), |ctx| async {
                    let marker = ctx.clone();
                    let result = async {
                        // Settled applied by a reconciler or a person: the
                        // outcome found is this run's, nothing forwarded —
                        // also for a run taking over one that died with it.
                        match ctx.settled_effect().await {
                            Ok(Some(bytes)) => {
                                settled.store(true, Ordering::Relaxed);
                                return settled_response(&bytes).map_err(Unstored::Unkept);
                            }
                            Ok(None) => {}
                            // Unread, a dead run's outcome stays unknown; an
                            // attempt after a release has sent nothing.
                            Err(_) if ctx.is_takeover() => {}
                            Err(error) => {
                                return Err(Unstored::NotExecuted(format!(
                                    "reading the settled outcome: {}",
                                    idem::error_chain(&error)
                                )))
                            }
                        }
                        if ctx.is_takeover() && !self.forward_takeovers {
                            return Err(Unstored::Takeover {
                                attempt: ctx.attempt(),
                            });
                        }
                        let Some(mut request) =
                            slot.lock().unwrap_or_else(PoisonError::into_inner).take()
                        else {
                            return Err(Unstored::NotExecuted(
                                "the request was already sent".into(),
                            ));
                        };
                        let fence = ctx.fence();
                        request.extensions_mut().insert(ctx);
                        executed.store(true, Ordering::Relaxed);
                        let response = match inner.call(request).await {
                            Ok(response) => response,
                            Err(error) => {
                                let error: BoxError = error.into();
                                return Err(if is_not_executed(&*error) {
                                    Unstored::NotExecuted(idem::error_chain(&*error))
                                } else {
                                    Unstored::Failed(idem::error_chain(&*error))
                                });
                            }
                        };
                        let (head, body) = response.into_parts();
                        if head.extensions.get::<OutcomeUnknown>().is_some() {
                            keep(Response::from_parts(head, IdemBody::new(body)));
                            return Err(Unstored::Unknown);
                        }
                        if !(self.stored)(head.status) {
                            let status = head.status;
                            keep(Response::from_parts(head, IdemBody::new(body)));
                            return Err(Unstored::Status(status));
                        }
                        // A gRPC error before any message comes in the head.
                        if let Some(unstored) = grpc_unstored(&head.headers, &head.headers) {
                            keep(Response::from_parts(head, IdemBody::new(body)));
                            return Err(unstored);
                        }
                        let too_large = Unstored::TooLarge {
                            limit: self.max_response_bytes,
                        };
                        match read_up_to(Box::pin(body), inline).await {
                            Read::All(bytes, trailers)
                                if StoredResponse::size_bound(
                                    &head.headers,
                                    bytes.len(),
                                    trailers.as_ref(),
                                ) > self.max_stored_bytes =>
                            {
                                // The body fits but the head does not: the client
                                // that caused it still gets its response.
                                keep(Response::from_parts(head, full(bytes, trailers)));
                                Err(too_large)
                            }
                            Read::All(bytes, trailers) => {
                                // A gRPC error after a message comes in the trailers.
                                if let Some(unstored) = trailers
                                    .as_ref()
                                    .and_then(|t| grpc_unstored(&head.headers, t))
                                {
                                    keep(Response::from_parts(head, full(bytes, trailers)));
                                    return Err(unstored);
                                }
                                let mut headers = head.headers;
                                strip_hop_by_hop(&mut headers);
                                let stored =
                                    StoredResponse::end_to_end(head.status, &headers, &bytes);
                                let stored = match &trailers {
                                    Some(trailers) => stored.with_trailers(trailers),
                                    None => stored,
                                };
                                // Its own client gets the whole response as
                                // stored, from the parts it was stored from
                                // rather than parsed back from the record.
                                let mut whole = Response::new(full(bytes, trailers));
                                *whole.status_mut() = head.status;
                                *whole.headers_mut() = headers;
                                keep(whole);
                                Ok(policy.reduce(&stored).unwrap_or(stored))
                            }
                            // Too large to store whole, but its body is not kept:
                            // stored reduced, and passed on to its client whole.
                            Read::Over { prefix, rest } if policy.drops_body() => {
                                let whole = StoredResponse::new(
                                    head.status,
                                    head.headers.clone(),
                                    Bytes::new(),
                                );
                                let reduced = policy.reduce(&whole).unwrap_or(whole);
                                keep(Response::from_parts(head, IdemBody::chain(prefix, rest)));
                                Ok(reduced)
                            }
                            // Kept by reference: the body goes to a blob, written and
                            // synced before the record names it.
                            Read::Over { prefix, rest }
                                if threshold.is_some() && fence.is_some() =>
                            {
                                let fence = fence.expect("checked");
                                let (blob, trailers) =
                                    self.to_blob(&id, fence, head.status, prefix, rest).await?;
                                // A gRPC error after the messages: not stored (the
                                // blob is left to the sweep), its client answered
                                // from the blob all the same.
                                if let Some(unstored) = trailers
                                    .as_ref()
                                    .and_then(|t| grpc_unstored(&head.headers, t))
                                {
                                    let answer = Response::from_parts(head, Bytes::new());
                                    keep(
                                        self.streamed_from_blob(answer, &blob, trailers, true)
                                            .await,
                                    );
                                    return Err(unstored);
                                }
                                let stored =
                                    StoredResponse::new(head.status, head.headers, Bytes::new());
                                let mut stored = match &trailers {
                                    Some(trailers) => stored.with_trailers(trailers),
                                    None => stored,
                                };
                                stored.kept = Kept::Reference(blob);
                                Ok(stored)
                            }
                            Read::Over { prefix, rest } => {
                                keep(Response::from_parts(head, IdemBody::chain(prefix, rest)));
                                Err(too_large)
                            }
                            Read::Failed(error) => Err(Unstored::BrokeOff {
                                status: head.status,
                                error: error.to_string(),
                            }),
                        }
                    }
                    .await;
                    if result
                        .as_ref()
                        .is_err_and(|e| e.class() == FailureClass::Unknown)
                    {
                        mark_in_doubt(&marker, &id).await;
                    }
                    result
                })
                .await;
            // A key found parked, or found held by a run that died (just
            // marked in doubt): the reconciler, if any, is asked once.
            let in_doubt = match &result {
                Err(RunError::Failed(failure)) => failure.is_parked(),
                Err(RunError::Handler { error, .. }) => matches!(error, Unstored::Takeover { .. }),
                _ => false,
            };
            if in_doubt && !reconciled && self.reconciling.is_some() {
                let question = slot
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map(|request| Question {
                        id: id.clone(),
                        method: request.method().clone(),
                        uri: request.uri().clone(),
                        headers: request.headers().clone(),
                    });
                if let Some(question) = question {
                    reconciled = true;
                    if self.reconcile(question).await {
                        continue;
                    }
                }
            }
            break result;
        };
        let kept = unstored
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let mut response = self.finish(
            self.answer(
                result,
                kept,
                executed.load(Ordering::Relaxed),
                settled.load(Ordering::Relaxed),
                rpc_id.as_ref(),
            )
            .await,
        );
        // Said only when a wait was asked for and allowed (RFC 7240 §3).
        if preferred && !wait.is_zero() {
            let applied = format!("wait={}", wait.as_secs());
            if let Ok(applied) = HeaderValue::from_str(&applied) {
                response.headers_mut().insert(PREFERENCE_APPLIED, applied);
            }
        }
        response
    }

    /// Adds the lifetime header to a covered response.
    pub(crate) fn finish(&self, mut response: Response<IdemBody>) -> Response<IdemBody> {
        response
            .headers_mut()
            .insert(LIFETIME, self.lifetime.clone());
        response
    }

    /// A rejection as a covered response.
    pub(crate) fn reject(&self, rejection: Rejection) -> Response<IdemBody> {
        self.finish(rejection.into_response().map(IdemBody::full))
    }

    /// A replay's headers: the stored ones less those left out, a `Date`
    /// of now, and `Idempotent-Replayed: true`.
    fn replay_headers(&self, headers: &mut http::HeaderMap) {
        for name in &self.replay_drop {
            headers.remove(name);
        }
        if self.replay_redate {
            let now = httpdate::fmt_http_date(std::time::SystemTime::now());
            if let Ok(now) = HeaderValue::from_str(&now) {
                headers.insert(http::header::DATE, now);
            }
        }
        headers.insert(REPLAYED, HeaderValue::from_static("true"));
    }

    async fn answer(
        &self,
        result: Result<Outcome<StoredResponse>, RunError<Unstored>>,
        kept: Option<Response<IdemBody>>,
        executed: bool,
        settled: bool,
        rpc_id: Option<&serde_json::Value>,
    ) -> Response<IdemBody> {
        let replayed = settled || matches!(result, Ok(Outcome::Replayed { .. }));
        let rejection = match result {
            // Stored: its own client gets the whole response.
            Ok(Outcome::Executed { .. } | Outcome::Unguarded { .. }) if kept.is_some() => {
                return kept.expect("checked");
            }
            Ok(outcome) => {
                let stored = outcome.into_value();
                return match stored
                    .to_response()
                    .and_then(|response| stored.trailer_map().map(|trailers| (response, trailers)))
                {
                    Ok((mut response, trailers)) => {
                        if replayed {
                            self.replay_headers(response.headers_mut());
                            if matches!(stored.kept, Kept::StatusOnly | Kept::Redacted) {
                                response.headers_mut().insert(
                                    REPLAY_KEPT,
                                    HeaderValue::from_static(stored.kept.as_str()),
                                );
                            }
                        }
                        if let (true, Some(id)) = (replayed, rpc_id) {
                            readdress(&mut response, id);
                        }
                        if let Kept::Reference(blob) = &stored.kept {
                            return self
                                .streamed_from_blob(response, blob, trailers, executed)
                                .await;
                        }
                        response.map(|bytes| full(bytes, trailers))
                    }
                    Err(reason) => Rejection::StoredUnreadable { reason }
                        .into_response()
                        .map(IdemBody::full),
                };
            }
            Err(RunError::Handler { error, .. }) => match (error, kept) {
                (
                    Unstored::Status(_)
                    | Unstored::GrpcStatus(_)
                    | Unstored::GrpcCutOff(_)
                    | Unstored::TooLarge { .. }
                    | Unstored::Unknown,
                    Some(response),
                ) => return response,
                (error @ Unstored::Takeover { .. }, _) => Rejection::OutcomeUnknown {
                    detail: error.to_string(),
                },
                (error, _) if error.class() == FailureClass::Unknown => Rejection::LostResponse {
                    detail: error.to_string(),
                },
                (error, _) => Rejection::Upstream {
                    detail: error.to_string(),
                },
            },
            Err(RunError::InProgress { retry_after }) => Rejection::InProgress { retry_after },
            Err(RunError::Mismatch) => Rejection::Mismatch,
            Err(RunError::Forgotten { age }) => Rejection::KeyExpired { age },
            Err(RunError::Failed(failure)) if failure.is_parked() => Rejection::OutcomeUnknown {
                detail: failure.message,
            },
            Err(RunError::Failed(failure)) => Rejection::NotStored {
                detail: failure.message,
            },
            // The store answered and refused the response (too large for
            // it, invalid): the run was recorded failed, so this is the
            // answer every retry gets too (docs/design.md §5.5).
            Err(RunError::Store(error)) if executed && error.is_refusal() => Rejection::NotStored {
                detail: format!("the store refused it: {}", idem::error_chain(&error)),
            },
            Err(RunError::Store(error)) => Rejection::StoreUnavailable {
                error: idem::error_chain(&error),
                executed,
            },
            Err(RunError::LeaseLost) => Rejection::LeaseLost,
            Err(RunError::Decode { reason }) => Rejection::StoredUnreadable { reason },
            Err(error) => Rejection::NotStored {
                detail: error.to_string(),
            },
        };
        rejection.into_response().map(IdemBody::full)
    }
}

/// A replayed answer to an MCP tool call, re-addressed to the retry's
/// JSON-RPC `id` and marked replayed ([`crate::mcp::replayed`]).
fn readdress(response: &mut Response<Bytes>, id: &serde_json::Value) {
    let event_stream = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().starts_with("text/event-stream"));
    if let Some(body) = crate::mcp::replayed(response.body(), event_stream, id) {
        response.headers_mut().remove(http::header::CONTENT_LENGTH);
        *response.body_mut() = body;
    }
}

/// Why the `grpc-status` in `fields` of a gRPC answer (by `head`'s
/// content type) is not stored, if it is not ([`grpc::verdict`]).
pub(super) fn grpc_unstored(head: &HeaderMap, fields: &HeaderMap) -> Option<Unstored> {
    let code = fields.get("grpc-status").filter(|_| grpc::is_grpc(head))?;
    let name = || String::from_utf8_lossy(code.as_bytes()).into_owned();
    match grpc::verdict(code.as_bytes()) {
        Verdict::Stored => None,
        Verdict::Released => Some(Unstored::GrpcStatus(name())),
        Verdict::Unknown => Some(Unstored::GrpcCutOff(name())),
    }
}

/// A body held in memory, with its trailers if it had any.
fn full(bytes: Bytes, trailers: Option<HeaderMap>) -> IdemBody {
    match trailers {
        Some(trailers) => IdemBody::full_with_trailers(bytes, trailers),
        None => IdemBody::full(bytes),
    }
}

/// Adds a trailers frame to those held: appended, not extended, so a name
/// repeated in a later frame keeps the earlier values.
pub(super) fn append_trailers(held: &mut HeaderMap, more: HeaderMap) {
    let mut name = None;
    for (next, value) in more {
        name = next.or(name);
        if let Some(name) = &name {
            held.append(name.clone(), value);
        }
    }
}

enum Read<B> {
    /// The whole body, and its trailers if it had any.
    All(Bytes, Option<HeaderMap>),
    Over {
        prefix: Bytes,
        rest: B,
    },
    Failed(BoxError),
}

/// Reads `body` whole, trailers included, if it is at most `limit` bytes;
/// otherwise stops past the limit and hands back what was read and the
/// rest.
async fn read_up_to<B>(mut body: B, limit: usize) -> Read<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut buf = BytesMut::new();
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        match frame.map(Frame::into_data) {
            Ok(Ok(data)) => {
                buf.extend_from_slice(&data);
                if buf.len() > limit {
                    return Read::Over {
                        prefix: buf.freeze(),
                        rest: body,
                    };
                }
            }
            Ok(Err(frame)) => {
                if let Ok(more) = frame.into_trailers() {
                    append_trailers(trailers.get_or_insert_with(HeaderMap::new), more);
                }
            }
            Err(error) => return Read::Failed(error.into()),
        }
    }
    Read::All(buf.freeze(), trailers)
}

/// Marks a run about to fail with an unknown outcome as in doubt, so a
/// reconciler or a person can settle it ([`crate::reconcile`]). A mark
/// that cannot be written leaves the key for `idem release`, as before.
async fn mark_in_doubt(ctx: &Context, id: &RecordId) {
    if let Err(error) = ctx.effect_in_doubt().await {
        tracing::warn!(%id, error = %idem::error_chain(&error), "could not mark the outcome in doubt");
    }
}
