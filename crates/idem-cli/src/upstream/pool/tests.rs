//! The pool against upstreams that answer from a script, byte for byte.

use http_body_util::BodyExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use super::*;

/// Answers one request with `ok` and reports how long after that the
/// connection was closed from the other side.
async fn one_answer(listener: TcpListener) -> Duration {
    let (mut socket, _) = listener.accept().await.expect("accept");
    read_head_off(&mut socket).await;
    socket
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        .await
        .expect("write");
    let answered = Instant::now();
    assert_eq!(socket.read(&mut [0u8; 1]).await.expect("read"), 0, "closed");
    answered.elapsed()
}

/// Reads a request's head off `socket`, leaving its body unread.
async fn read_head_off(socket: &mut tokio::net::TcpStream) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = socket.read(&mut buf).await.expect("read");
        assert!(n > 0, "the head came whole");
        seen.extend_from_slice(&buf[..n]);
    }
}

/// An upstream that writes `answer` as soon as a request's head is in,
/// reading none of its body, then closes the connection, or (`hold`)
/// keeps it open until the sender it returns is used or dropped.
async fn answering_early(
    answer: &'static [u8],
    hold: bool,
) -> (
    Pool,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let pool = Pool::new(
        listener.local_addr().expect("addr").to_string(),
        Duration::from_secs(5),
    );
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let upstream = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        read_head_off(&mut socket).await;
        socket.write_all(answer).await.expect("write");
        if hold {
            let _ = finished.await;
        }
    });
    (pool, done, upstream)
}

/// A POST of `body` to `/upload`.
fn upload(body: Body) -> http::Request<Body> {
    http::Request::post("/upload")
        .header(http::header::HOST, "upstream")
        .body(body)
        .expect("request")
}

/// A body of `chunks` pieces of 64 KiB, its length not known ahead.
fn streamed(chunks: usize) -> Body {
    let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
    Body::from_stream(futures_util::stream::iter(
        std::iter::repeat_n(chunk, chunks).map(Ok::<_, std::io::Error>),
    ))
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
    assert_eq!(text(response).await, "ok");
    assert_eq!(idle(&pool), 1);
    let closed_after = tokio::time::timeout(IDLE_TIMEOUT * 2, upstream)
        .await
        .expect("the idle connection was closed")
        .expect("upstream");
    assert!(closed_after >= IDLE_TIMEOUT, "{closed_after:?}");
    assert!(idle(&pool) == 0);
}

/// What a scripted upstream does after an answer.
#[derive(Clone, Copy)]
enum Then {
    Keep,
    Close,
}

/// Answers each request with the next of `answers`, in whichever
/// connection it came, and returns once the last is written: each
/// request's connection (0, 1, …) and bytes. A request ends at its
/// head's end, or at a chunked body's last chunk, or after
/// `content-length` bytes.
async fn scripted(
    listener: TcpListener,
    answers: Vec<(&'static [u8], Then)>,
) -> Vec<(usize, Vec<u8>)> {
    let mut seen = Vec::new();
    let mut answers = answers.into_iter();
    let mut connection = 0;
    'connections: loop {
        let (mut socket, _) = listener.accept().await.expect("accept");
        loop {
            let Some(request) = read_request(&mut socket).await else {
                connection += 1;
                continue 'connections;
            };
            seen.push((connection, request));
            let Some((answer, then)) = answers.next() else {
                return seen;
            };
            socket.write_all(answer).await.expect("write");
            if answers.len() == 0 {
                return seen;
            }
            if let Then::Close = then {
                drop(socket);
                connection += 1;
                continue 'connections;
            }
        }
    }
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    let complete = |r: &[u8]| {
        let Some(end) = r.windows(4).position(|w| w == b"\r\n\r\n") else {
            return false;
        };
        let head = String::from_utf8_lossy(&r[..end]).to_ascii_lowercase();
        if head.contains("transfer-encoding: chunked") {
            // The last chunk, and the trailer section's end.
            let body = &r[end + 4..];
            return body.ends_with(b"\r\n\r\n")
                && (body.starts_with(b"0\r\n") || body.windows(5).any(|w| w == b"\r\n0\r\n"));
        }
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |n| n.trim().parse::<usize>().expect("length"));
        r.len() >= end + 4 + length
    };
    while !complete(&request) {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        request.extend_from_slice(&buf[..n]);
    }
    Some(request)
}

fn get(path: &str) -> http::Request<Body> {
    http::Request::get(path)
        .header(http::header::HOST, "upstream")
        .body(Body::empty())
        .expect("request")
}

/// A response's whole body.
async fn text(response: Response) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
}

/// How many connections the pool keeps idle.
fn idle(pool: &Pool) -> usize {
    pool.shared.idle.lock().expect("lock").len()
}

/// The connection each request came in, once the script has ended.
async fn connections(upstream: tokio::task::JoinHandle<Vec<(usize, Vec<u8>)>>) -> Vec<usize> {
    upstream
        .await
        .expect("upstream")
        .iter()
        .map(|(c, _)| *c)
        .collect()
}

async fn pool_and(
    answers: Vec<(&'static [u8], Then)>,
) -> (Pool, tokio::task::JoinHandle<Vec<(usize, Vec<u8>)>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let pool = Pool::new(
        listener.local_addr().expect("addr").to_string(),
        Duration::from_secs(5),
    );
    (pool, tokio::spawn(scripted(listener, answers)))
}

#[tokio::test]
async fn chunks_and_trailers_come_through_and_the_connection_is_kept() {
    let (pool, upstream) = pool_and(vec![
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\ngrpc-status: 0\r\n\r\n",
            Then::Keep,
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", Then::Keep),
    ])
    .await;
    // Read as hyper's server reads it: no poll after the trailers.
    let mut body = pool.send(get("/a")).await.expect("response").into_body();
    let mut data = Vec::new();
    let trailers = loop {
        let frame = body.frame().await.expect("a frame").expect("valid");
        match frame.into_data() {
            Ok(d) => data.extend_from_slice(&d),
            Err(frame) => break frame.into_trailers().expect("trailers"),
        }
    };
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(data, b"hello world");
    assert_eq!(idle(&pool), 1, "back with its trailers");
    let response = pool.send(get("/b")).await.expect("response");
    assert_eq!(text(response).await, "ok");
    let seen = upstream.await.expect("upstream");
    let connections: Vec<usize> = seen.iter().map(|(c, _)| *c).collect();
    assert_eq!(connections, [0, 0], "one connection for both");
    assert!(seen[1]
        .1
        .starts_with(b"GET /b HTTP/1.1\r\nhost: upstream\r\n\r\n"));
}

#[tokio::test]
async fn a_body_until_the_close_is_read_whole_and_its_connection_not_kept() {
    let (pool, upstream) = pool_and(vec![
        (b"HTTP/1.1 200 OK\r\n\r\nall of it", Then::Close),
        (b"HTTP/1.1 204 No Content\r\n\r\n", Then::Keep),
    ])
    .await;
    let response = pool.send(get("/a")).await.expect("response");
    let body = response.into_body().collect().await.expect("body");
    assert_eq!(body.to_bytes(), "all of it");
    let response = pool.send(get("/b")).await.expect("response");
    assert_eq!(response.status(), http::StatusCode::NO_CONTENT);
    assert_eq!(idle(&pool), 1, "a 204 goes back at once");
    assert_eq!(connections(upstream).await, [0, 1]);
}

#[tokio::test]
async fn bytes_after_a_response_are_never_taken_for_the_next() {
    let (pool, upstream) = pool_and(vec![
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale", Then::Keep),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfresh", Then::Keep),
    ])
    .await;
    let response = pool.send(get("/a")).await.expect("response");
    assert_eq!(text(response).await, "ok");
    let response = pool.send(get("/b")).await.expect("response");
    assert_eq!(text(response).await, "fresh");
    assert_eq!(connections(upstream).await, [0, 1]);
}

#[tokio::test]
async fn a_kept_connection_the_upstream_closed_is_replaced_before_anything_is_sent() {
    let (pool, upstream) = pool_and(vec![
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
            Then::Close,
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nagain",
            Then::Keep,
        ),
    ])
    .await;
    let response = pool.send(get("/a")).await.expect("response");
    assert_eq!(text(response).await, "ok");
    assert_eq!(idle(&pool), 1, "kept: nothing said close");
    // The upstream's end of stream arrives while the connection is idle.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let response = pool
        .send(get("/b"))
        .await
        .expect("a fresh connection, not an error");
    assert_eq!(text(response).await, "again");
    let seen = upstream.await.expect("upstream");
    assert_eq!(seen.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [0, 1]);
}

#[tokio::test]
async fn a_body_of_unknown_length_goes_out_in_chunks_and_a_small_one_with_its_head() {
    let (pool, upstream) = pool_and(vec![
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Then::Keep),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Then::Keep),
    ])
    .await;
    let pieces = futures_util::stream::iter([Ok::<_, std::io::Error>("ab"), Ok("cde")]);
    let streamed = http::Request::post("/s")
        .header(http::header::HOST, "upstream")
        .body(Body::from_stream(pieces))
        .expect("request");
    pool.send(streamed).await.expect("response");
    let whole = http::Request::post("/w")
        .header(http::header::HOST, "upstream")
        .body(Body::from("{\"a\":1}"))
        .expect("request");
    pool.send(whole).await.expect("response");
    let seen = upstream.await.expect("upstream");
    assert_eq!(
        String::from_utf8_lossy(&seen[0].1),
        "POST /s HTTP/1.1\r\nhost: upstream\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&seen[1].1),
        "POST /w HTTP/1.1\r\nhost: upstream\r\ncontent-length: 7\r\n\r\n{\"a\":1}"
    );
}

#[tokio::test]
async fn a_request_s_trailers_end_its_chunked_body_and_have_no_place_after_a_length() {
    let (pool, upstream) = pool_and(vec![
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Then::Keep),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Then::Keep),
    ])
    .await;
    let with_trailers = |length: Option<&str>| {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-digest", http::HeaderValue::from_static("sha-256=abc"));
        let frames = futures_util::stream::iter([
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::trailers(trailers)),
        ]);
        let mut request = http::Request::post("/t")
            .header(http::header::HOST, "upstream")
            .header(http::header::TRAILER, "x-digest");
        if let Some(length) = length {
            request = request.header(http::header::CONTENT_LENGTH, length);
        }
        request
            .body(Body::new(http_body_util::StreamBody::new(frames)))
            .expect("request")
    };
    pool.send(with_trailers(None)).await.expect("response");
    pool.send(with_trailers(Some("2"))).await.expect("response");
    let seen = upstream.await.expect("upstream");
    assert_eq!(
        String::from_utf8_lossy(&seen[0].1),
        "POST /t HTTP/1.1\r\nhost: upstream\r\ntrailer: x-digest\r\ntransfer-encoding: chunked\r\n\r\n\
         2\r\nab\r\n0\r\nx-digest: sha-256=abc\r\n\r\n"
    );
    assert_eq!(
        String::from_utf8_lossy(&seen[1].1),
        "POST /t HTTP/1.1\r\nhost: upstream\r\ntrailer: x-digest\r\ncontent-length: 2\r\n\r\nab"
    );
    assert_eq!(seen.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [0, 0]);
}

#[tokio::test]
async fn a_response_cut_short_is_an_error_after_the_sending() {
    let (pool, upstream) = pool_and(vec![
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
            Then::Close,
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-le", Then::Close),
    ])
    .await;
    let response = pool.send(get("/a")).await.expect("head");
    let error = response.into_body().collect().await.expect_err("cut short");
    assert!(
        error.to_string().contains("before the body's end"),
        "{error}"
    );
    match pool.send(get("/b")).await {
        Err(Failed::Sent(error)) => {
            assert!(error.to_string().contains("before its response"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert!(idle(&pool) == 0);
    upstream.await.expect("upstream");
}

/// An upstream that refuses a body it will not read (a 413) and closes
/// the connection: its answer comes through, not a failure to write.
#[tokio::test]
async fn an_answer_before_the_body_end_comes_through() {
    let (pool, _done, upstream) = answering_early(
        b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 4\r\n\r\nbig!",
        false,
    )
    .await;
    let response = pool
        .send(upload(streamed(256)))
        .await
        .expect("the upstream's answer");
    assert_eq!(response.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(text(response).await, "big!");
    assert!(idle(&pool) == 0, "not kept");
    upstream.await.expect("upstream");
}

/// A body that does not match its `Content-Length` is never sent as if it
/// did: the upstream would take the rest for another request, or wait.
#[tokio::test]
async fn a_body_that_belies_its_length_is_refused_and_its_connection_dropped() {
    let (pool, upstream) = pool_and(vec![(
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        Then::Keep,
    )])
    .await;
    for (declared, pieces) in [("3", vec!["ab", "cd"]), ("9", vec!["ab", "cd"])] {
        let streamed = http::Request::post("/s")
            .header(http::header::HOST, "upstream")
            .header(http::header::CONTENT_LENGTH, declared)
            .body(Body::from_stream(futures_util::stream::iter(
                pieces.into_iter().map(Ok::<_, std::io::Error>),
            )))
            .expect("request");
        match pool.send(streamed).await {
            Err(Failed::Sent(e)) => assert!(e.to_string().contains("Content-Length"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(idle(&pool) == 0);
    pool.send(get("/after")).await.expect("response");
    let seen = upstream.await.expect("upstream");
    let last = seen.last().expect("a request");
    assert!(
        last.1.starts_with(b"GET /after"),
        "{:?}",
        String::from_utf8_lossy(&last.1)
    );
    assert_eq!(
        seen.iter()
            .filter(|(_, r)| r.starts_with(b"GET /after"))
            .count(),
        1
    );
}

/// An upstream that answers before the body's end and neither reads the
/// rest nor closes: the answer comes through while the body's writes are
/// blocked, and the connection is not kept.
#[tokio::test]
async fn an_answer_while_the_body_is_blocked_comes_through() {
    let (pool, done, upstream) = answering_early(
        b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\nno",
        true,
    )
    .await;
    let response = tokio::time::timeout(Duration::from_secs(5), pool.send(upload(streamed(1024))))
        .await
        .expect("answered while the body was blocked")
        .expect("the upstream's answer");
    assert_eq!(response.status(), http::StatusCode::UNAUTHORIZED);
    assert_eq!(text(response).await, "no");
    assert!(idle(&pool) == 0, "not kept");
    let _ = done.send(());
    upstream.await.expect("upstream");
}

/// A whole body (its end known with its last bytes) whose last write is
/// blocked when the upstream answers early with a kept-alive response:
/// the connection is not kept, since the upstream still waits for the
/// rest of the body and would take the next request's bytes for it.
#[tokio::test]
async fn a_connection_whose_body_was_cut_by_an_early_answer_is_not_kept() {
    let (pool, done, upstream) = answering_early(
        b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 0\r\n\r\n",
        true,
    )
    .await;
    let whole = Body::from(vec![b'x'; 8 << 20]);
    let response = tokio::time::timeout(Duration::from_secs(5), pool.send(upload(whole)))
        .await
        .expect("answered while the body was blocked")
        .expect("the upstream's answer");
    assert_eq!(response.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
    assert!(idle(&pool) == 0, "not kept");
    let _ = done.send(());
    upstream.await.expect("upstream");
}
