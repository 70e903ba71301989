//! Heads and bodies taken apart byte by byte, and heads written.

use super::*;

fn head(bytes: &[u8], to_head: bool) -> (Head, BytesMut) {
    let mut buf = BytesMut::from(bytes);
    let head = parse_head(&mut buf, to_head)
        .expect("valid")
        .expect("whole");
    (head, buf)
}

/// The body's pieces, fed one byte at a time: data joined, trailers.
fn body(framing: &mut Framing, rest: &[u8]) -> Result<(Vec<u8>, Option<HeaderMap>), Malformed> {
    let mut buf = BytesMut::new();
    let mut input = rest.iter();
    let mut data = Vec::new();
    let mut trailers = None;
    loop {
        match framing.next(&mut buf)? {
            Piece::Data(d) => data.extend_from_slice(&d),
            Piece::Trailers(t) => trailers = Some(t),
            Piece::End => return Ok((data, trailers)),
            Piece::More => match input.next() {
                Some(b) => buf.extend_from_slice(&[*b]),
                None => return Err(Malformed("cut short".to_owned())),
            },
        }
    }
}

#[test]
fn a_head_is_parsed_whole_and_only_when_whole() {
    let bytes = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nx-a: 1\r\nx-a: 2\r\n\r\nokHTTP";
    for cut in 0..bytes.len() - 6 {
        let mut buf = BytesMut::from(&bytes[..cut]);
        assert!(
            parse_head(&mut buf, false).expect("valid").is_none(),
            "{cut}"
        );
    }
    let (head, rest) = head(bytes, false);
    assert_eq!(head.response.status(), StatusCode::CREATED);
    assert_eq!(head.framing, Framing::Length(2));
    assert!(head.keep_alive);
    let values: Vec<_> = head.response.headers().get_all("x-a").iter().collect();
    assert_eq!(values, ["1", "2"]);
    // Room for the forwarding fields of the next request parsed into it.
    assert!(head.response.headers().capacity() >= 3 + 4);
    assert_eq!(&rest[..], b"okHTTP");
}

#[test]
fn interim_responses_are_passed_over() {
    let (head, rest) = head(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        false,
    );
    assert_eq!(head.response.status(), StatusCode::OK);
    assert!(head.response.headers().get("link").is_none());
    assert!(rest.is_empty());
}

#[test]
fn framing_follows_rfc_9112() {
    use Framing::{Chunked, Close, Length};
    let cases: [(&[u8], bool, (Framing, bool)); 13] = [
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
            true,
            (Length(0), true),
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", false, (Length(0), true)),
        (
            b"HTTP/1.1 304 Not Modified\r\n\r\n",
            false,
            (Length(0), true),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\n\r\n",
            false,
            (Chunked(Chunks::Size), true),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            false,
            (Chunked(Chunks::Size), false),
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            false,
            (Chunked(Chunks::Size), false),
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            false,
            (Close, false),
        ),
        (b"HTTP/1.1 200 OK\r\n\r\n", false, (Close, false)),
        (
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\ncontent-length: 1\r\n\r\n",
            false,
            (Length(1), false),
        ),
        (
            b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
            false,
            (Length(1), false),
        ),
        (
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
            false,
            (Length(1), true),
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\ncontent-length: 7\r\n\r\n",
            false,
            (Length(7), true),
        ),
        (
            b"HTTP/1.1 500 Oops\r\nConnection: close\r\ncontent-length: 0\r\n\r\n",
            false,
            (Length(0), false),
        ),
    ];
    for (bytes, to_head, expected) in cases {
        let (head, _) = head(bytes, to_head);
        assert_eq!(
            (head.framing, head.keep_alive),
            expected,
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn broken_heads_are_refused_with_a_reason() {
    for bytes in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
    ] {
        let mut buf = BytesMut::from(bytes);
        let error = parse_head(&mut buf, false).expect_err("refused");
        assert!(!error.0.is_empty());
    }
    let mut endless = BytesMut::from(&b"HTTP/1.1 200 OK\r\nx: "[..]);
    endless.resize(MAX_HEAD, b'a');
    let error = parse_head(&mut endless, false).expect_err("too long");
    assert!(error.0.contains("longer than"), "{error}");
}

#[test]
fn bodies_are_cut_at_their_framing_byte_by_byte() {
    let mut framing = Framing::Length(3);
    assert_eq!(body(&mut framing, b"abcdef").expect("body").0, b"abc");
    let mut framing = Framing::Chunked(Chunks::Size);
    let (data, trailers) = body(
        &mut framing,
        b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\ngrpc-status: 0\r\nx-b: 2\r\n\r\nnext",
    )
    .expect("body");
    assert_eq!(data, b"abc0123456789abcdef");
    let trailers = trailers.expect("trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(trailers["x-b"], "2");
    assert!(framing.ended());
    let mut framing = Framing::Chunked(Chunks::Size);
    let (data, trailers) = body(&mut framing, b"1\r\nx\r\n0\r\n\r\n").expect("body");
    assert_eq!((data.as_slice(), trailers), (&b"x"[..], None));
}

#[test]
fn broken_chunks_are_refused() {
    for bytes in [
        &b"3\r\nabcd\r\n0\r\n\r\n"[..],
        b"zz\r\n",
        b"3\r\nabc\r\n0\r\nbad header\r\n\r\n",
        // No size: httparse would read these as the last chunk.
        b"3\r\nabc\r\n\r\n",
        b"3\r\nabc\r\n;x\r\n0\r\n\r\n",
    ] {
        let mut framing = Framing::Chunked(Chunks::Size);
        assert!(
            body(&mut framing, bytes).is_err(),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    // A size line, or a trailer section, that never ends.
    for (start, framing) in [
        (&b"1;"[..], Framing::Chunked(Chunks::Size)),
        (b"x-a: ", Framing::Chunked(Chunks::Trailers)),
    ] {
        let mut framing = framing;
        let mut buf = BytesMut::from(start);
        buf.resize(MAX_LINE, b'a');
        let error = framing.next(&mut buf).expect_err("too long");
        assert!(error.0.contains("longer than"), "{error}");
    }
}

#[test]
fn a_close_delimited_body_is_everything_read() {
    let mut framing = Framing::Close;
    let mut buf = BytesMut::from(&b"all of it"[..]);
    match framing.next(&mut buf).expect("valid") {
        Piece::Data(d) => assert_eq!(&d[..], b"all of it"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(framing.next(&mut buf), Ok(Piece::More)));
}

#[test]
fn a_head_is_written_with_the_framing_its_body_needs() {
    let encode = |method: Method, headers: &[(&str, &str)], size: SizeHint| {
        let mut request = http::Request::builder().method(method).uri("/a?b=1");
        for (n, v) in headers {
            request = request.header(*n, *v);
        }
        let (parts, ()) = request.body(()).expect("request").into_parts();
        let mut out = Vec::new();
        let sending = encode_head(&parts, &size, &mut out).expect("valid");
        (String::from_utf8(out).expect("utf-8"), sending)
    };
    assert_eq!(
        encode(Method::GET, &[("host", "up")], SizeHint::with_exact(0)),
        (
            "GET /a?b=1 HTTP/1.1\r\nhost: up\r\n\r\n".to_owned(),
            Sending::Length(0)
        )
    );
    assert_eq!(
        encode(Method::POST, &[("host", "up")], SizeHint::with_exact(0)),
        (
            "POST /a?b=1 HTTP/1.1\r\nhost: up\r\ncontent-length: 0\r\n\r\n".to_owned(),
            Sending::Length(0)
        )
    );
    assert_eq!(
        encode(
            Method::POST,
            &[("host", "up"), ("content-length", "5")],
            SizeHint::default()
        ),
        (
            "POST /a?b=1 HTTP/1.1\r\nhost: up\r\ncontent-length: 5\r\n\r\n".to_owned(),
            Sending::Length(5)
        )
    );
    assert_eq!(
        encode(Method::PUT, &[("host", "up")], SizeHint::with_exact(12)),
        (
            "PUT /a?b=1 HTTP/1.1\r\nhost: up\r\ncontent-length: 12\r\n\r\n".to_owned(),
            Sending::Length(12)
        )
    );
    assert_eq!(
        encode(Method::POST, &[("host", "up")], SizeHint::default()),
        (
            "POST /a?b=1 HTTP/1.1\r\nhost: up\r\ntransfer-encoding: chunked\r\n\r\n".to_owned(),
            Sending::Chunked
        )
    );
    let (parts, ()) = http::Request::post("/")
        .header("content-length", "5, 6")
        .body(())
        .expect("request")
        .into_parts();
    let error = encode_head(&parts, &SizeHint::default(), &mut Vec::new()).expect_err("refused");
    assert!(error.0.contains("the request's"), "{error}");
    let mut out = Vec::new();
    encode_chunk(&[7; 26], &mut out);
    assert_eq!(&out[..4], b"1a\r\n");
    assert!(out.ends_with(b"\r\n"));
}

#[test]
fn a_length_beside_chunks_is_dropped() {
    let (head, _) = head(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
        false,
    );
    assert!(head.response.headers().get("content-length").is_none());
    assert!(!head.keep_alive);
}
