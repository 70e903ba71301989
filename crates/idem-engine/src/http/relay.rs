//! [`Relay`]: the layer's inner service, which hands each request's turn
//! to run over to the adapter's handler (in its own language, on its own
//! thread or event loop) and waits for the response it makes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use idem::BoxError;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tower_service::Service;

use super::message::HttpResponse;

/// The turn to run: the run's context (`None` when the request passed
/// through unguarded), and where the handler's response goes.
pub(crate) struct Turn {
    pub(crate) ctx: Option<idem::Context>,
    pub(crate) respond: oneshot::Sender<HttpResponse>,
}

/// Where a request's [`Turn`] is sent, as a request extension (which must
/// be `Clone`): taken once.
#[derive(Clone)]
pub(crate) struct TurnSlot(pub(crate) Arc<Mutex<Option<oneshot::Sender<Turn>>>>);

/// The handler gave no answer the layer can use: none at all (its turn
/// was dropped), or a response that is not HTTP.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NoAnswer(String);

#[derive(Debug, Clone, Copy)]
pub(crate) struct Relay;

type Answer = Result<Response<Full<Bytes>>, BoxError>;

impl Service<Request<Full<Bytes>>> for Relay {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        let slot = request
            .extensions()
            .get::<TurnSlot>()
            .and_then(|slot| slot.0.lock().take());
        let ctx = request.extensions().get::<idem::Context>().cloned();
        Box::pin(async move {
            let slot = slot.ok_or_else(|| NoAnswer("the request was passed on twice".into()))?;
            let (respond, response) = oneshot::channel();
            slot.send(Turn { ctx, respond })
                .map_err(|_| NoAnswer("the adapter stopped waiting for its turn".into()))?;
            let response = response
                .await
                .map_err(|_| NoAnswer("the handler ended without an answer".into()))?;
            Ok(response.into_http().map_err(NoAnswer)?)
        })
    }
}
