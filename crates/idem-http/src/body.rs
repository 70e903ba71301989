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
use idem::blob::BlobChunks;
use idem::BoxError;
use tokio::sync::mpsc;

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

    /// A blob's `len` bytes streamed as they are read (a few chunks in
    /// memory at a time), then `trailers`. A blob that turns out corrupt
    /// (its digest or length not the one its record names) ends the body
    /// with an error before its last chunk, so the client sees it cut
    /// off, never other bytes whole.
    pub fn from_blob(mut chunks: BlobChunks, len: u64, trailers: Option<HeaderMap>) -> Self {
        let (tx, rx) = mpsc::channel(2);
        let has_trailers = trailers.is_some();
        tokio::spawn(async move {
            // The last chunk is held back until the digest is checked, so
            // a corrupt blob never reaches its client whole.
            let mut held: Option<Bytes> = None;
            loop {
                match chunks.next().await {
                    Ok(Some(chunk)) => {
                        if let Some(ready) = held.replace(chunk) {
                            if tx.send(Ok(Frame::data(ready))).await.is_err() {
                                return;
                            }
                        }
                    }
                    Ok(None) => {
                        if let Some(last) = held.take() {
                            if tx.send(Ok(Frame::data(last))).await.is_err() {
                                return;
                            }
                        }
                        break;
                    }
                    Err(error) => {
                        metrics::counter!(idem::metrics::BLOBS_UNREADABLE, "reason" => "corrupt")
                            .increment(1);
                        tracing::error!(%error, "a replayed body's blob is unreadable; the replay was cut off");
                        let _ = tx.send(Err(error.into())).await;
                        return;
                    }
                }
            }
            if let Some(trailers) = trailers {
                let _ = tx.send(Ok(Frame::trailers(trailers))).await;
            }
        });
        Self::new(Streamed {
            rx,
            remaining: len,
            has_trailers,
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

/// A body read by another task, frame by frame.
struct Streamed {
    rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    remaining: u64,
    has_trailers: bool,
}

impl Body for Streamed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = std::task::ready!(self.rx.poll_recv(cx));
        if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
            let read = data.map_or(0, |d| d.len() as u64);
            self.remaining = self.remaining.saturating_sub(read);
        }
        Poll::Ready(frame)
    }

    fn size_hint(&self) -> SizeHint {
        hint(self.remaining, self.has_trailers)
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

    fn size_hint(&self) -> SizeHint {
        let len = self.data.as_ref().map_or(0, |d| d.len() as u64);
        hint(len, self.trailers.is_some())
    }
}

/// The size of a body with `len` bytes of data still to come: not exact
/// while trailers are to come too, so an HTTP/1.1 server sends it chunked,
/// the one framing that carries trailers, instead of with a
/// `Content-Length`.
fn hint(len: u64, trailers_to_come: bool) -> SizeHint {
    if !trailers_to_come {
        return SizeHint::with_exact(len);
    }
    let mut hint = SizeHint::new();
    hint.set_lower(len);
    hint
}
