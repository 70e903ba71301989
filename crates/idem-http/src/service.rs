//! The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around an
//! inner service.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use idem::store::BoxFuture;
use idem::{BoxError, Store};
use tower_service::Service;
use tracing::Instrument as _;

use crate::body::IdemBody;
use crate::detach::Detachable;
use crate::grpc;
use crate::rejection::Rejection;
use crate::request::{Settings, Step, REPLAYED};

/// The service made by [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// Covered requests with a key run to completion: the future this service
/// returns drives the run, and hands it to a task of its own if it is
/// dropped first (the client went away), so the run does not stop. The
/// inner service receives the run's [`idem::Context`] in the request's
/// extensions.
pub struct IdempotencyService<S, I> {
    settings: Arc<Settings<S>>,
    inner: I,
}

impl<S, I> IdempotencyService<S, I> {
    pub(crate) fn new(settings: Arc<Settings<S>>, inner: I) -> Self {
        Self { settings, inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &I {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut I {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> I {
        self.inner
    }
}

impl<S, I: Clone> Clone for IdempotencyService<S, I> {
    fn clone(&self) -> Self {
        Self {
            settings: Arc::clone(&self.settings),
            inner: self.inner.clone(),
        }
    }
}

impl<S, I: std::fmt::Debug> std::fmt::Debug for IdempotencyService<S, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, I, B, RB> Service<Request<B>> for IdempotencyService<S, I>
where
    S: Store,
    I: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    I::Future: Send,
    I::Error: Into<BoxError> + Send,
    B: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<IdemBody>;
    type Error = I::Error;
    type Future = BoxFuture<'static, Result<Response<IdemBody>, I::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let settings = Arc::clone(&self.settings);
        if !settings.covers(request.method()) {
            return Box::pin(async move { Ok(inner.call(request).await?.map(IdemBody::new)) });
        }
        // idem's own answers to a gRPC caller are gRPC statuses.
        let grpc = grpc::is_grpc(request.headers());
        // Without a key, and none to look for: no run, and none of its
        // future's size to move (a tenth of the hop's instructions).
        if settings.passes_through(request.headers(), request.uri()) {
            return Box::pin(async move {
                let response = inner.call(request).await?.map(IdemBody::new);
                Ok(if grpc {
                    grpc::answer(response)
                } else {
                    response
                })
            });
        }
        let span = tracing::debug_span!(
            "idem.http",
            method = %request.method(),
            path = request.uri().path(),
            status = tracing::field::Empty,
            replayed = tracing::field::Empty,
        );
        let answer = async move {
            let prepared = match settings.prepare(request).await {
                Step::Run(prepared) => prepared,
                Step::PassThrough(unkeyed) => {
                    return Ok(inner.call(unkeyed).await?.map(IdemBody::new));
                }
                Step::Refused(answer) => return Ok(answer),
            };
            // From the claim on, a client that disconnects drops only this
            // future, not the work: the run goes on in a task of its own.
            let run = {
                let settings = Arc::clone(&settings);
                let counted = settings.runs.token();
                Detachable::new(
                    async move {
                        let _counted = counted;
                        settings.run(prepared, inner).await
                    }
                    .instrument(tracing::Span::current()),
                )
            };
            Ok(match run.await {
                Ok(response) => response,
                Err(error) => settings.reject(Rejection::Internal {
                    detail: format!("the run stopped: {error}"),
                }),
            })
        };
        Box::pin(
            async move {
                let answer = answer.await.map(|response| {
                    if grpc {
                        grpc::answer(response)
                    } else {
                        response
                    }
                });
                if let Ok(response) = &answer {
                    let span = tracing::Span::current();
                    span.record("status", response.status().as_u16());
                    span.record("replayed", response.headers().contains_key(REPLAYED));
                }
                answer
            }
            .instrument(span),
        )
    }
}
