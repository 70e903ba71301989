//! The floor under the gateway's hop, for `scripts/bench-gateway`: an
//! HTTP/1.1 forwarder that parses each head with httparse (once, when it
//! comes whole) and copies the message through unchanged, on one
//! upstream connection per client connection while the upstream keeps it
//! open (as nginx keeps its upstream connections alive). It keeps
//! no keys, adds no forwarding headers and runs on tokio's multi-threaded
//! runtime, as `idem proxy` does: what the gateway's hop would cost with
//! its own HTTP/1.1 path and nothing else.
//!
//! Given a store (`sqlite:PATH` or `memory:`), a request with an
//! `Idempotency-Key` runs through idem's executor on it, as the gateway
//! runs one: fingerprinted (its JSON body's digest, framed with its
//! method and target), claimed, forwarded from a task of its own (as the
//! gateway detaches its runs from their connections; here it is only the
//! cost, as nothing watches the client meanwhile), and its response's
//! bytes stored as they came and answered to every retry, whatever its
//! status (the gateway stores no 5xx; the benchmark's upstream answers
//! `201`). What a unique key
//! would cost with that path: the executor and the store as they are,
//! without hyper, axum or the middleware's `http` types. Requests
//! without a key pass through as above.
//!
//! Not a proxy to use: a request's body must be framed by
//! `Content-Length` or absent (a request that is not gets `400` and its
//! connection closed), a response must have a `Content-Length` (or gets
//! its client a `502`), and `HEAD`, `1xx`, `204` and `304` exchanges are
//! not special.
//!
//! Run: `cargo run --release -p idem-examples --example hop_floor --
//! 127.0.0.1:3905 127.0.0.1:3900 [sqlite:/tmp/floor.db]` (listen, the
//! upstream, and the store, if any).

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::ops::Range;

use idem::{Fingerprint, Idempotency, MemoryStore, RecordId, RunError, Store};
use idem_http::Binary;
use idem_sqlite::SqliteStore;
use serde_bytes::ByteBuf;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The most header fields a head may have.
const MAX_HEADERS: usize = 64;
/// Room a connection's buffers start with, and keep free for a read.
const BUF: usize = 8 * 1024;
/// The most a message (head and body) may take.
const MAX_MESSAGE: usize = 1024 * 1024;

/// Which side of the exchange a message comes from.
#[derive(Clone, Copy)]
enum Side {
    Client,
    Upstream,
}

/// A whole message at the front of a buffer.
struct Message {
    /// Its length, head and body.
    len: usize,
    /// Its head's length.
    head: usize,
    /// Whether it says `Connection: close`.
    close: bool,
    /// A request's `Idempotency-Key`, where it is in the buffer.
    key: Option<Range<usize>>,
    /// A request's method and target (`POST /charges`), where they are
    /// in the buffer.
    target: Range<usize>,
}

/// The whole message at the front of `buf`, `Ok(None)` while it is
/// incomplete.
fn message_at(buf: &[u8], side: Side) -> io::Result<Option<Message>> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let config = httparse::ParserConfig::default();
    let (parsed, headers, target) = match side {
        Side::Client => {
            let mut head = httparse::Request::new(&mut []);
            let parsed = config.parse_request_with_uninit_headers(&mut head, buf, &mut slots);
            // From the method, not the buffer's start: blank lines may
            // come before a request line.
            let target = match (head.method, head.path) {
                (Some(method), Some(path)) => {
                    offset(buf, method.as_bytes()).start..offset(buf, path.as_bytes()).end
                }
                _ => 0..0,
            };
            (parsed, head.headers, target)
        }
        Side::Upstream => {
            let mut head = httparse::Response::new(&mut []);
            let parsed = config.parse_response_with_uninit_headers(&mut head, buf, &mut slots);
            (parsed, head.headers, 0..0)
        }
    };
    let head = match parsed.map_err(|e| invalid(e.to_string()))? {
        httparse::Status::Complete(head) => head,
        httparse::Status::Partial => return Ok(None),
    };
    let (mut body, mut close, mut key) = (None, false, None);
    for field in headers.iter() {
        if field.name.eq_ignore_ascii_case("idempotency-key") {
            key = Some(offset(buf, field.value));
        }
        if field.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(invalid("only Content-Length framing is supported".into()));
        }
        if field.name.eq_ignore_ascii_case("content-length") {
            let length = std::str::from_utf8(field.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| invalid("a Content-Length that is not a length".into()))?;
            body = Some(length);
        }
        if field.name.eq_ignore_ascii_case("connection") {
            close |= field
                .value
                .split(|&b| b == b',')
                .any(|option| option.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
    let body = match (body, side) {
        (Some(body), _) => body,
        (None, Side::Client) => 0,
        (None, Side::Upstream) => {
            return Err(invalid("a response without Content-Length".into()));
        }
    };
    let len = head.saturating_add(body);
    if len > MAX_MESSAGE {
        return Err(invalid(format!("a message of {len} bytes")));
    }
    Ok((buf.len() >= len).then_some(Message {
        len,
        head,
        close,
        key,
        target,
    }))
}

/// Where `part`, a slice of `buf`, is in it.
fn offset(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Reads from `io` until a whole message is at the front of `buf`; it,
/// or `None` when `io` ends cleanly between messages.
async fn read_message(
    io: &mut TcpStream,
    buf: &mut Vec<u8>,
    side: Side,
) -> io::Result<Option<Message>> {
    loop {
        if !buf.is_empty() {
            if let Some(message) = message_at(buf, side)? {
                return Ok(Some(message));
            }
        }
        if buf.len() > MAX_MESSAGE {
            return Err(invalid(format!("a head over {MAX_MESSAGE} bytes")));
        }
        buf.reserve(BUF);
        if io.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    }
}

/// The executor a covered request runs through, on the store given.
#[derive(Clone)]
enum Runs {
    Sqlite(Idempotency<SqliteStore, Binary>),
    Memory(Idempotency<MemoryStore, Binary>),
}

impl Runs {
    /// The executor on `store` (`sqlite:PATH` or `memory:`), configured as
    /// the gateway configures its own: responses in postcard, and attempts
    /// unbounded (a failed run is released for the client's retry).
    fn open(store: &str) -> io::Result<Self> {
        fn executor<S: Store>(store: S) -> io::Result<Idempotency<S, Binary>> {
            Idempotency::builder(store)
                .codec(Binary)
                .max_attempts(NonZeroU32::MAX)
                .build()
                .map_err(|e| invalid(e.to_string()))
        }
        match store.split_once(':') {
            Some(("sqlite", path)) => Ok(Self::Sqlite(executor(
                SqliteStore::open(path).map_err(|e| invalid(e.to_string()))?,
            )?)),
            Some(("memory", "")) => Ok(Self::Memory(executor(MemoryStore::new())?)),
            _ => Err(invalid(format!(
                "a store is sqlite:PATH or memory:, not {store:?}"
            ))),
        }
    }
}

/// Forwards `client`'s requests to `upstream` one at a time, each answer
/// back as it came, on one upstream connection while the upstream keeps
/// it open; with `runs`, a request with a key runs through it.
async fn serve(mut client: TcpStream, upstream: SocketAddr, runs: Option<Runs>) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut to_upstream: Option<TcpStream> = None;
    let (mut request, mut response) = (Vec::with_capacity(BUF), Vec::with_capacity(BUF));
    loop {
        let message = match read_message(&mut client, &mut request, Side::Client).await {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::InvalidData => {
                return answer(&mut client, "400 Bad Request", &error).await;
            }
            Err(error) => return Err(error),
        };
        let len = message.len;
        if let (Some(runs), Some(key)) = (&runs, message.key.clone()) {
            let run = Run {
                request: request[..len].to_vec(),
                message,
                key,
                upstream,
                to_upstream: to_upstream.take(),
            };
            request.drain(..len);
            let (kept, answered) = run.detached(runs.clone()).await;
            to_upstream = kept;
            match answered {
                Ok(response) => client.write_all(&response).await?,
                Err((status, why)) => return answer(&mut client, status, &why).await,
            }
            continue;
        }
        let exchanged = exchange(&mut to_upstream, upstream, &request[..len], &mut response).await;
        request.drain(..len);
        let message = match exchanged {
            Ok(message) => message,
            Err(error) => return answer(&mut client, "502 Bad Gateway", &error).await,
        };
        client.write_all(&response[..message.len]).await?;
        response.drain(..message.len);
        if message.close {
            to_upstream = None;
        }
    }
}

/// A request with a key, to run through the executor.
struct Run {
    /// The whole request, head and body.
    request: Vec<u8>,
    /// Where its parts are.
    message: Message,
    /// Where its key is.
    key: Range<usize>,
    upstream: SocketAddr,
    /// The connection's upstream connection, if it has one open.
    to_upstream: Option<TcpStream>,
}

/// A covered request's answer: the response's bytes, or a status and why.
type Answered = Result<Vec<u8>, (&'static str, io::Error)>;

impl Run {
    /// Runs the request through `idem` on a task of its own, as the
    /// gateway runs it; the upstream connection (to keep, if it is still
    /// good) and the answer (a `500` if the task panicked).
    async fn detached(self, runs: Runs) -> (Option<TcpStream>, Answered) {
        tokio::spawn(async move {
            match runs {
                Runs::Sqlite(idem) => self.run(idem).await,
                Runs::Memory(idem) => self.run(idem).await,
            }
        })
        .await
        .unwrap_or_else(|e| {
            let why = io::Error::other(format!("the run's task failed: {e}"));
            (None, Err(("500 Internal Server Error", why)))
        })
    }

    async fn run<S: Store>(
        mut self,
        idem: Idempotency<S, Binary>,
    ) -> (Option<TcpStream>, Answered) {
        // The scope names the method and target, as the gateway's names
        // the method and route.
        let target = String::from_utf8_lossy(&self.request[self.message.target.clone()]);
        let Ok(key) = std::str::from_utf8(&self.request[self.key.clone()]) else {
            let why = invalid("the Idempotency-Key is not UTF-8".into());
            return (self.to_upstream, Err(("400 Bad Request", why)));
        };
        let id = match RecordId::parse(&format!("http {target}"), key) {
            Ok(id) => id,
            Err(e) => {
                return (
                    self.to_upstream,
                    Err(("400 Bad Request", invalid(e.to_string()))),
                )
            }
        };
        let body = &self.request[self.message.head..self.message.len];
        let digest = Fingerprint::of_json(body).unwrap_or_else(|_| Fingerprint::of_bytes(body));
        let mut framed = self.request[self.message.target.clone()].to_vec();
        framed.push(0);
        framed.extend_from_slice(digest.as_bytes());
        let (request, upstream) = (&self.request, self.upstream);
        let to_upstream = &mut self.to_upstream;
        let ran = idem
            .run(&id, Some(Fingerprint::of_bytes(&framed)), |_| async move {
                let mut response = Vec::with_capacity(BUF);
                let message = exchange(to_upstream, upstream, request, &mut response).await?;
                if message.close {
                    *to_upstream = None;
                }
                response.truncate(message.len);
                Ok::<_, io::Error>(ByteBuf::from(response))
            })
            .await;
        let answered = match ran {
            Ok(outcome) => Ok(outcome.into_value().into_vec()),
            Err(RunError::InProgress { .. }) => {
                Err(("409 Conflict", invalid("in progress".into())))
            }
            Err(RunError::Mismatch) => Err((
                "422 Unprocessable Content",
                invalid("the key was used with another request".into()),
            )),
            Err(RunError::Handler { error, .. }) => Err(("502 Bad Gateway", error)),
            Err(error) => Err((
                "500 Internal Server Error",
                io::Error::other(error.to_string()),
            )),
        };
        (self.to_upstream, answered)
    }
}

/// Sends `request` on the upstream connection (opened if there is none)
/// and reads its answer into `response`. A connection that failed is
/// not kept.
async fn exchange(
    to_upstream: &mut Option<TcpStream>,
    upstream: SocketAddr,
    request: &[u8],
    response: &mut Vec<u8>,
) -> io::Result<Message> {
    let up = match to_upstream {
        Some(up) => up,
        None => {
            let up = TcpStream::connect(upstream).await?;
            up.set_nodelay(true)?;
            to_upstream.insert(up)
        }
    };
    let answered = async {
        up.write_all(request).await?;
        read_message(up, response, Side::Upstream)
            .await?
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))
    }
    .await;
    if answered.is_err() {
        *to_upstream = None;
        response.clear();
    }
    answered
}

/// Answers `status` with why, and closes the connection.
async fn answer(client: &mut TcpStream, status: &str, why: &io::Error) -> io::Result<()> {
    let why = format!("{why}\n");
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        why.len()
    );
    client.write_all(head.as_bytes()).await?;
    client.write_all(why.as_bytes()).await?;
    client.shutdown().await
}

#[tokio::main]
async fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:3905".to_owned());
    let upstream: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:3900".to_owned())
        .parse()
        .map_err(|e| invalid(format!("the upstream's address: {e}")))?;
    let runs = args.next().map(|store| Runs::open(&store)).transpose()?;
    let listener = TcpListener::bind(&listen).await?;
    eprintln!("hop floor listening on {listen}, forwarding to {upstream}");
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(error) => {
                // Out of file descriptors, say: pause and go on.
                eprintln!("accept failed: {error}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let runs = runs.clone();
        tokio::spawn(async move {
            match serve(client, upstream, runs).await {
                // A client that hangs up (wrk at the end of a run) is no news.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                Err(error) => eprintln!("connection ended: {error}"),
                Ok(()) => {}
            }
        });
    }
}
