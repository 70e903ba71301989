//! HTTP/1.1 to a cleartext upstream on kept-alive connections that the
//! request's own task reads and writes.
//!
//! hyper-util's pooled client runs every connection as a task of its own:
//! a request is handed to it through a channel, and its response and each
//! body chunk come back through others, two task wake-ups a request at
//! least; hyper's own connection, driven by the request, still passes the
//! request and the response through its channels and state machine. Here
//! a request takes a connection out of the pool, writes its head (and a
//! body already at hand) in one write, parses the response's head once
//! (`super::h1`) and reads the body from the socket as it is polled,
//! then puts the connection back once the body has ended: the gateway's
//! hop is one task from the client's socket to the upstream's and back.
//!
//! A connection is only reused once its response has been read to the end
//! and nothing else arrived after it; one whose response was cut off (the
//! client went away, the deadline passed) is closed. One the upstream
//! closed while it sat idle is found so when it is taken out (its end of
//! stream is already there to read) or, racing that, when the first write
//! fails: nothing reached the upstream, and the request goes out on a new
//! connection. Nothing is ever sent twice: once a write has succeeded, a
//! failure is the request's. A body is written while the answer is
//! watched for, so an upstream that answers early (a 413, a 401) is
//! answered even while it reads no more. The rest of the body is then not
//! sent: a full-duplex exchange (the response streaming while the
//! request's body still goes out), which hyper's client carried, is not.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::FutureExt as _;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use idem::BoxError;
use tokio::io::{AsyncRead, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::h1::{self, Framing, Piece, Sending};

/// How long a connection may sit idle in the pool before it is closed
/// (hyper-util's default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The most idle connections kept; more are closed when they come back.
const MAX_IDLE: usize = 1024;

/// The most of a request's body that goes out in the head's write, when
/// it is already at hand.
const WITH_HEAD: u64 = 64 * 1024;

/// How much room a read is given.
const READ_ROOM: usize = 16 * 1024;

/// Kept-alive HTTP/1.1 connections to one `host:port`.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// `host:port`, resolved at each connect.
    address: String,
    connect_timeout: Duration,
    /// Most recently used last: a request takes the warmest connection,
    /// and the coldest are closed first.
    idle: Mutex<VecDeque<Idle>>,
}

/// One connection, and what was read from it and not yet taken.
#[derive(Debug)]
struct Conn {
    io: TcpStream,
    read: BytesMut,
}

#[derive(Debug)]
struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Nothing was sent: no connection could be made.
    Connect(String),
    /// The request went (or may have gone) out, and no response came back.
    Sent(BoxError),
}

impl Pool {
    /// A pool for `address` (`host:port`); connecting is limited to
    /// `connect_timeout`. Inside a Tokio runtime, a task closes the
    /// connections left idle too long; outside one, only a request that
    /// takes one out closes it.
    pub(crate) fn new(address: String, connect_timeout: Duration) -> Self {
        let shared = Arc::new(Shared {
            address,
            connect_timeout,
            idle: Mutex::new(VecDeque::new()),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(reap(Arc::downgrade(&shared)));
        }
        Self { shared }
    }

    /// Sends `request` (origin-form URI, `Host` set) and returns its
    /// response, whose body is read from the connection as it is polled.
    pub(crate) async fn send(&self, request: http::Request<Body>) -> Result<Response, Failed> {
        let (parts, mut body) = request.into_parts();
        let mut out = Vec::with_capacity(512);
        let mut sending = h1::encode_head(&parts, &body.size_hint(), &mut out)
            .map_err(|e| Failed::Connect(e.to_string()))?;
        let mut ended = body.is_end_stream() && sending == Sending::Length(0);
        // A body already at hand, up to 64 KiB (a covered request's, read
        // whole by then), goes out in the head's write.
        if !ended && body.size_hint().upper().is_some_and(|n| n <= WITH_HEAD) {
            if let Some(frame) = body.frame().now_or_never() {
                // Nothing has gone out yet.
                ended = put(frame, &body, &mut sending, &mut out).map_err(Failed::Connect)?;
            }
        }
        let mut conn = loop {
            let (mut conn, reused) = match self.checkout() {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            match conn.io.write(&out).await {
                Ok(n) => {
                    conn.io
                        .write_all(&out[n..])
                        .await
                        .map_err(|e| Failed::Sent(e.into()))?;
                    break conn;
                }
                // Nothing reached the upstream: a kept-alive connection it
                // had closed is replaced by a fresh one.
                Err(_) if reused => {}
                Err(e) => {
                    return Err(Failed::Connect(format!(
                        "write to {}: {e}",
                        self.shared.address
                    )))
                }
            }
        };
        let to_head = parts.method == http::Method::HEAD;
        // The rest of the body is written while the answer is watched
        // for: an upstream may answer before the body's end (a 413, say)
        // and stop reading. Then the body is not sent on, and the
        // connection is not kept; an answer read after the body could not
        // be written is still the answer.
        let mut finished = ended;
        let (head, cut) = if ended {
            (read_head(&mut conn.read, &mut conn.io, to_head).await, None)
        } else {
            let (mut from, mut to) = conn.io.split();
            let reading = read_head(&mut conn.read, &mut from, to_head);
            let writing = async {
                while !finished {
                    out.clear();
                    let frame = body.frame().await;
                    let last = put(frame, &body, &mut sending, &mut out).map_err(Cut::Body)?;
                    to.write_all(&out).await.map_err(Cut::Socket)?;
                    // Finished once its last bytes are out: a write cut off
                    // by an early answer leaves the upstream waiting for
                    // them, and the connection must not be kept.
                    finished = last;
                }
                Ok(())
            };
            tokio::pin!(reading, writing);
            tokio::select! {
                biased;
                head = &mut reading => (head, None),
                wrote = &mut writing => match wrote {
                    Ok(()) => (reading.await, None),
                    Err(Cut::Body(e)) => return Err(Failed::Sent(e.into())),
                    Err(Cut::Socket(e)) => (reading.await, Some(e)),
                },
            }
        };
        let head = head.map_err(|e| {
            Failed::Sent(cut.map_or(e, |cut| format!("writing the request's body: {cut}").into()))
        })?;
        let mut body = Driven {
            conn: Some(conn),
            framing: head.framing,
            keep_alive: head.keep_alive && finished,
            pool: Arc::downgrade(&self.shared),
        };
        // A response without a body (to HEAD, a 204, a 304) is never read:
        // its connection goes back now.
        if body.framing.ended() {
            body.release();
        }
        Ok(head.response.map(|()| body))
    }

    /// The most recently used idle connection still open, if any.
    fn checkout(&self) -> Option<Box<Conn>> {
        loop {
            // Checked and closed outside the lock.
            let Idle { mut conn, since } = self
                .shared
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_back()?;
            if since.elapsed() < IDLE_TIMEOUT && conn.is_open() {
                return Some(conn);
            }
        }
    }

    async fn connect(&self) -> Result<Box<Conn>, Failed> {
        let shared = &self.shared;
        let limit = shared.connect_timeout;
        let stream = match tokio::time::timeout(limit, TcpStream::connect(&shared.address)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                return Err(Failed::Connect(format!(
                    "connect to {}: {e}",
                    shared.address
                )))
            }
            Err(_) => {
                return Err(Failed::Connect(format!(
                    "no connection to {} within {limit:?}",
                    shared.address
                )))
            }
        };
        // The head goes out in one write; waiting on Nagle for the
        // upstream's ACK would only add latency.
        let _ = stream.set_nodelay(true);
        // Boxed once: a request moves it in and out of the pool.
        Ok(Box::new(Conn {
            io: stream,
            read: BytesMut::new(),
        }))
    }
}

/// Why the rest of a request's body did not go out.
enum Cut {
    /// The body failed (its client went away, or it belied its length).
    Body(String),
    /// The connection would not take it.
    Socket(std::io::Error),
}

/// Reads the response's head from `io` into `read` and parses it.
async fn read_head(
    read: &mut BytesMut,
    io: &mut (impl AsyncRead + Unpin),
    to_head: bool,
) -> Result<h1::Head, BoxError> {
    loop {
        if let Some(head) = h1::parse_head(read, to_head)? {
            return Ok(head);
        }
        if std::future::poll_fn(|cx| fill(Pin::new(&mut *io), cx, read)).await? == 0 {
            return Err("the upstream closed the connection before its response".into());
        }
    }
}

/// Reads what `io` has into `read`, with room for a good part.
fn fill(
    io: Pin<&mut impl AsyncRead>,
    cx: &mut Context<'_>,
    read: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    if read.capacity() - read.len() < READ_ROOM / 4 {
        read.reserve(READ_ROOM);
    }
    tokio_util::io::poll_read_buf(io, cx, read)
}

/// Appends `frame` of a request's body to `out` as `sending` frames it,
/// and says whether the body has ended: the frame is the end, or `body`
/// says so. A body longer or shorter than its `Content-Length` is an
/// error (the upstream would read the rest as another request, or wait
/// for it). A request's trailers end a chunked body as its trailer
/// section; a body sent with a length has no place for them (RFC 9112
/// §6.1: only chunked bodies carry trailers), and they are left out.
fn put(
    frame: Option<Result<Frame<Bytes>, axum::Error>>,
    body: &Body,
    sending: &mut Sending,
    out: &mut Vec<u8>,
) -> Result<bool, String> {
    let ended = match frame {
        None => true,
        Some(Err(e)) => return Err(format!("the request's body could not be read: {e}")),
        Some(Ok(frame)) => match frame.into_data() {
            Ok(data) => {
                match sending {
                    Sending::Length(left) => {
                        *left = left.checked_sub(data.len() as u64).ok_or_else(|| {
                            "the request's body is longer than its Content-Length".to_owned()
                        })?;
                        out.extend_from_slice(&data);
                    }
                    Sending::Chunked if data.is_empty() => {}
                    Sending::Chunked => h1::encode_chunk(&data, out),
                }
                body.is_end_stream()
            }
            // Trailers are a body's last frame.
            Err(frame) => match (frame.into_trailers(), &sending) {
                (Ok(trailers), Sending::Chunked) => {
                    h1::encode_last_chunk(&trailers, out);
                    return Ok(true);
                }
                _ => true,
            },
        },
    };
    match sending {
        Sending::Length(left) if ended && *left > 0 => {
            Err("the request's body ended before its Content-Length".to_owned())
        }
        Sending::Chunked if ended => {
            out.extend_from_slice(h1::LAST_CHUNK);
            Ok(true)
        }
        _ => Ok(ended),
    }
}

impl Conn {
    /// Reads what the upstream sent into `read`.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        fill(Pin::new(&mut self.io), cx, &mut self.read)
    }

    /// Whether another request can go out on it: nothing is waiting to be
    /// read (the end of a stream the upstream closed, or bytes it had no
    /// reason to send), found without waiting and without a system call
    /// while the socket has not become readable.
    fn is_open(&mut self) -> bool {
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(Waker::noop());
        self.read.is_empty()
            && Pin::new(&mut self.io)
                .poll_read(&mut cx, &mut probe)
                .is_pending()
    }
}

/// Closes, every so often, the connections left idle too long or closed
/// by the upstream, until the pool is dropped.
async fn reap(pool: Weak<Shared>) {
    let mut every = tokio::time::interval(IDLE_TIMEOUT / 3);
    every.tick().await;
    loop {
        every.tick().await;
        let Some(shared) = pool.upgrade() else { return };
        let mut idle = shared.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain_mut(|i| i.since.elapsed() < IDLE_TIMEOUT && i.conn.is_open());
    }
}

/// A response from the pool.
pub(crate) type Response = http::Response<Driven>;

/// A response body read from its connection as it is polled, which puts
/// the connection back in the pool at its end.
#[derive(Debug)]
pub struct Driven {
    /// `None` once the body has ended (or failed).
    conn: Option<Box<Conn>>,
    framing: Framing,
    keep_alive: bool,
    pool: Weak<Shared>,
}

impl Driven {
    /// The body has ended: the connection goes back to the pool if it may
    /// carry another request and nothing more came after the response.
    fn release(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if !self.keep_alive || !conn.read.is_empty() {
            return;
        }
        let Some(shared) = self.pool.upgrade() else {
            return;
        };
        let mut idle = shared.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push_back(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}

impl http_body::Body for Driven {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = &mut this.conn else {
                return Poll::Ready(None);
            };
            let piece = match this.framing.next(&mut conn.read) {
                Ok(piece) => piece,
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            };
            match piece {
                Piece::Data(data) => {
                    if this.framing.ended() {
                        this.release();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                // The body's last frame: hyper's server polls no further.
                Piece::Trailers(trailers) => {
                    this.release();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Piece::End => {
                    this.release();
                    return Poll::Ready(None);
                }
                Piece::More => match std::task::ready!(conn.poll_read(cx)) {
                    Ok(0) if this.framing == Framing::Close => {
                        this.conn = None;
                        return Poll::Ready(None);
                    }
                    Ok(0) => {
                        this.conn = None;
                        return Poll::Ready(Some(Err(
                            "the upstream closed the connection before the body's end".into(),
                        )));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        this.conn = None;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.framing.ended()
    }

    fn size_hint(&self) -> SizeHint {
        if self.conn.is_none() {
            return SizeHint::with_exact(0);
        }
        self.framing.size_hint()
    }
}

#[cfg(test)]
mod tests;
