//! The middleware's response body: the inner service's body streamed
//! through, bytes held in memory (replays, problems), or bytes already
//! read followed by the rest of the inner body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use idem::BoxError;

/// The body of every response the middleware returns.
pub struct IdemBody(UnsyncBoxBody<Bytes, BoxError>);

impl IdemBody {
    /// Streams `body` through unchanged.
    pub fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self(body.map_err(Into::into).boxed_unsync())
    }

    /// Bytes held in memory.
    pub fn full(bytes: Bytes) -> Self {
        Self(
            Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
    }

    /// Bytes held in memory, then `trailers`.
    pub fn full_with_trailers(bytes: Bytes, trailers: HeaderMap) -> Self {
        Self::new(Held {
            data: Some(bytes).filter(|b| !b.is_empty()),
            trailers: Some(trailers),
        })
    }

    /// `prefix` (already read from `rest`), then the remainder of `rest`.
    pub(crate) fn chain<B>(prefix: Bytes, rest: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self::new(Chain {
            prefix: Some(prefix),
            rest: Box::pin(rest),
        })
    }
}

impl std::fmt::Debug for IdemBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdemBody").finish_non_exhaustive()
    }
}

impl Body for IdemBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

struct Chain<B> {
    prefix: Option<Bytes>,
    rest: Pin<Box<B>>,
}

impl<B> Body for Chain<B>
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
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        self.rest.as_mut().poll_frame(cx).map_err(Into::into)
    }
}

/// A body held in memory that ends with trailers.
struct Held {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for Held {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let frame = match self.data.take() {
            Some(data) => Some(Frame::data(data)),
            None => self.trailers.take().map(Frame::trailers),
        };
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    /// Not exact while trailers are to come: an HTTP/1.1 server then
    /// sends the body chunked, the one framing that carries trailers,
    /// instead of with a `Content-Length`.
    fn size_hint(&self) -> SizeHint {
        let len = self.data.as_ref().map_or(0, |d| d.len() as u64);
        if self.trailers.is_none() {
            return SizeHint::with_exact(len);
        }
        let mut hint = SizeHint::new();
        hint.set_lower(len);
        hint
    }
}
