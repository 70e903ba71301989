//! The floor under the gateway's hop, for `scripts/bench-gateway`: an
//! HTTP/1.1 forwarder that parses each head with httparse (once, when it
//! comes whole) and copies the message through unchanged, on one
//! upstream connection per client connection while the upstream keeps it
//! open (as nginx keeps its upstream connections alive). It keeps
//! no keys, adds no forwarding headers and runs on tokio's multi-threaded
//! runtime, as `idem proxy` does: what the gateway's hop would cost with
//! its own HTTP/1.1 path and nothing else.
//!
//! Not a proxy to use: a request's body must be framed by
//! `Content-Length` or absent (a request that is not gets `400` and its
//! connection closed), a response must have a `Content-Length` (or gets
//! its client a `502`), and `HEAD`, `1xx`, `204` and `304` exchanges are
//! not special.
//!
//! Run: `cargo run --release -p idem-examples --example hop_floor --
//! 127.0.0.1:3905 127.0.0.1:3900` (listen, then the upstream).

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;

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
    /// Whether it says `Connection: close`.
    close: bool,
}

/// The whole message at the front of `buf`, `Ok(None)` while it is
/// incomplete.
fn message_at(buf: &[u8], side: Side) -> io::Result<Option<Message>> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let config = httparse::ParserConfig::default();
    let (parsed, headers) = match side {
        Side::Client => {
            let mut head = httparse::Request::new(&mut []);
            let parsed = config.parse_request_with_uninit_headers(&mut head, buf, &mut slots);
            (parsed, head.headers)
        }
        Side::Upstream => {
            let mut head = httparse::Response::new(&mut []);
            let parsed = config.parse_response_with_uninit_headers(&mut head, buf, &mut slots);
            (parsed, head.headers)
        }
    };
    let head = match parsed.map_err(|e| invalid(e.to_string()))? {
        httparse::Status::Complete(head) => head,
        httparse::Status::Partial => return Ok(None),
    };
    let (mut body, mut close) = (None, false);
    for field in headers.iter() {
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
    Ok((buf.len() >= len).then_some(Message { len, close }))
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

/// Forwards `client`'s requests to `upstream` one at a time, each answer
/// back as it came, on one upstream connection while the upstream keeps
/// it open.
async fn serve(mut client: TcpStream, upstream: SocketAddr) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut to_upstream: Option<TcpStream> = None;
    let (mut request, mut response) = (Vec::with_capacity(BUF), Vec::with_capacity(BUF));
    loop {
        let len = match read_message(&mut client, &mut request, Side::Client).await {
            Ok(Some(message)) => message.len,
            Ok(None) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::InvalidData => {
                return answer(&mut client, "400 Bad Request", &error).await;
            }
            Err(error) => return Err(error),
        };
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
        tokio::spawn(async move {
            match serve(client, upstream).await {
                // A client that hangs up (wrk at the end of a run) is no news.
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                Err(error) => eprintln!("connection ended: {error}"),
                Ok(()) => {}
            }
        });
    }
}
