//! HTTP/1.1 to a cleartext upstream on kept-alive connections that the
//! request's own task drives.
//!
//! hyper-util's pooled client runs every connection as a task of its own:
//! a request is handed to it through a channel, and its response and each
//! body chunk come back through others, two task wake-ups a request at
//! least. Here a request takes a connection out of the pool and polls it
//! itself, while it waits for the head and while its body is read, and
//! puts it back once the body has ended: the gateway's hop is one task
//! from the client's socket to the upstream's and back.
//!
//! A connection is only reused once its response has been read to the end
//! and hyper says it is ready for another; one whose response was cut off
//! (the client went away, the deadline passed) is closed. One the upstream
//! closed while it sat idle is found so when it is taken out (hyper reads
//! the end of the stream) or, racing that, hyper hands the request back
//! unsent; then it goes out on a new connection. Nothing is ever sent
//! twice: a request hyper has begun writing is never retried.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long a connection may sit idle in the pool before it is closed
/// (hyper-util's default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The most idle connections kept; more are closed when they come back.
const MAX_IDLE: usize = 1024;

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

/// One connection: the handle requests are sent through, and the
/// connection itself, which does the reading and writing when polled.
#[derive(Debug)]
struct Conn {
    sender: SendRequest<Body>,
    driver: Connection<TokioIo<TcpStream>, Body>,
    /// The driver has finished: the connection is closed.
    closed: bool,
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
    Sent(hyper::Error),
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
    /// response, whose body keeps driving the connection until it ends.
    pub(crate) async fn send(&self, mut request: http::Request<Body>) -> Result<Response, Failed> {
        loop {
            let (mut conn, reused) = match self.checkout() {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            let mut sent = std::pin::pin!(conn.sender.try_send_request(request));
            let answer = poll_fn(|cx| {
                conn.drive(cx);
                sent.as_mut().poll(cx)
            })
            .await;
            match answer {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    let mut body = Driven {
                        body,
                        conn: Some(conn),
                        pool: Arc::downgrade(&self.shared),
                    };
                    // A response without a body (to HEAD, a 204, a 304) is
                    // never read: its connection goes back now.
                    if http_body::Body::is_end_stream(&body.body) {
                        poll_fn(|cx| {
                            body.release(cx);
                            Poll::Ready(())
                        })
                        .await;
                    }
                    return Ok(http::Response::from_parts(parts, body));
                }
                Err(mut e) => match e.take_message() {
                    // Handed back unsent: a kept-alive connection the
                    // upstream had closed. A fresh one is tried.
                    Some(unsent) if reused => request = unsent,
                    Some(_) => return Err(Failed::Connect(e.into_error().to_string())),
                    None => return Err(Failed::Sent(e.into_error())),
                },
            }
        }
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
        let (sender, driver) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failed::Connect(format!("HTTP/1.1 to {}: {e}", shared.address)))?;
        // Boxed once: a request moves it in and out of the pool.
        Ok(Box::new(Conn {
            sender,
            driver,
            closed: false,
        }))
    }
}

impl Conn {
    /// Lets the connection read and write what it can.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.closed && Pin::new(&mut self.driver).poll(cx).is_ready() {
            self.closed = true;
        }
    }

    /// Whether another request can go out on it: the end of a stream the
    /// upstream closed is read here, without waiting.
    fn is_open(&mut self) -> bool {
        self.drive(&mut Context::from_waker(Waker::noop()));
        !self.closed && self.sender.is_ready()
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

/// A response body that drives its connection while it is read, and puts
/// the connection back in the pool at its end.
#[derive(Debug)]
pub struct Driven {
    body: Incoming,
    /// `None` once the body has ended and the connection gone back.
    conn: Option<Box<Conn>>,
    pool: Weak<Shared>,
}

impl Driven {
    /// The body has ended: the connection goes back to the pool if hyper
    /// is ready to send another request on it.
    fn release(&mut self, cx: &mut Context<'_>) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        // One more turn lets hyper finish the message and say it wants
        // the next one.
        conn.drive(cx);
        if conn.closed || !conn.sender.is_ready() {
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
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(conn) = &mut this.conn {
            conn.drive(cx);
        }
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if frame.is_none() || this.body.is_end_stream() {
            this.release(cx);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    use super::*;

    /// Answers one request with `ok` and reports how long after that the
    /// connection was closed from the other side.
    async fn one_answer(listener: TcpListener) -> Duration {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.expect("read");
            request.extend_from_slice(&buf[..n]);
        }
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .await
            .expect("write");
        let answered = Instant::now();
        assert_eq!(socket.read(&mut buf).await.expect("read"), 0, "closed");
        answered.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_goes_back_at_its_body_end_and_is_closed_once_idle_too_long() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let pool = Pool::new(
            listener.local_addr().expect("addr").to_string(),
            Duration::from_secs(1),
        );
        let upstream = tokio::spawn(one_answer(listener));
        let request = http::Request::get("/")
            .header(http::header::HOST, "upstream")
            .body(Body::empty())
            .expect("request");
        let response = pool.send(request).await.expect("response");
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes(), "ok");
        assert_eq!(pool.shared.idle.lock().expect("lock").len(), 1);
        let closed_after = tokio::time::timeout(IDLE_TIMEOUT * 2, upstream)
            .await
            .expect("the idle connection was closed")
            .expect("upstream");
        assert!(closed_after >= IDLE_TIMEOUT, "{closed_after:?}");
        assert!(pool.shared.idle.lock().expect("lock").is_empty());
    }
}
