//! A response body that must end by a deadline: the upstream's answer is
//! limited as a whole (head and body), so a body that stalls cannot keep a
//! request's lease alive for as long as its socket lives.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use idem::BoxError;
use tokio::time::{Instant, Sleep};

/// `body`, failing with an error once `deadline` passes before its end.
pub(crate) struct Deadline<B> {
    body: Pin<Box<B>>,
    sleep: Pin<Box<Sleep>>,
    limit: Duration,
}

impl<B> Deadline<B> {
    /// `body` must end by `deadline`; `limit` is how the error names it.
    pub(crate) fn new(body: B, deadline: Instant, limit: Duration) -> Self {
        Self {
            body: Box::pin(body),
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            limit,
        }
    }
}

/// The body did not end in time.
#[derive(Debug, thiserror::Error)]
#[error("the upstream's response did not finish within {0:?}")]
pub(crate) struct TooSlow(Duration);

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(frame) = self.body.as_mut().poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(TooSlow(self.limit).into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
