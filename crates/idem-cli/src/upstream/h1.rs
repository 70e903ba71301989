//! HTTP/1.1 to the upstream in bytes (RFC 9112): a request's head written
//! straight from its parts, a response's head parsed once (httparse) into
//! its parts, and its body taken apart by its framing: a length, chunks,
//! or the connection's end.
//!
//! Nothing here touches a socket: the pool (`super::pool`) reads into the
//! buffer these functions take from, and writes what they encode.

use std::mem::MaybeUninit;

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING,
};
use http::{Method, StatusCode, Version};
use http_body::SizeHint;

/// The most a response's head may take before it is refused: hyper's
/// default read buffer.
pub(crate) const MAX_HEAD: usize = 8192 + 4096 * 100;

/// The most header fields a response's head or trailer section may have
/// (hyper's default).
const MAX_HEADERS: usize = 100;

/// The most a chunk's size line (with its extensions) or a trailer
/// section may take: hyper's limits. Each is parsed again from its start
/// at every read until it is whole, so a long one that trickles in costs
/// time as the square of its length.
const MAX_LINE: usize = 16 * 1024;

/// A response the upstream sent that cannot be read as HTTP/1.1.
#[derive(Debug, thiserror::Error)]
#[error("the upstream's response is not valid HTTP/1.1: {0}")]
pub(crate) struct Malformed(pub(crate) String);

/// How a request's body goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    /// As it is, this many bytes more (its `Content-Length`, or none).
    Length(u64),
    /// In chunks: its length is not known ahead.
    Chunked,
}

/// Writes the head of `request` (an origin-form target, `Host` among its
/// headers) to `out`, adding the framing its body needs (`size`: the
/// body's size hint), and says how the body must follow. A
/// `Content-Length` that is not one number is refused.
pub(crate) fn encode_head(
    parts: &http::request::Parts,
    size: &SizeHint,
    out: &mut Vec<u8>,
) -> Result<Sending, Malformed> {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    encode_fields(&parts.headers, out);
    let sending = if let Some(length) = content_length(&parts.headers)
        .map_err(|Malformed(e)| Malformed(format!("the request's {e}")))?
    {
        Sending::Length(length)
    } else {
        match size.exact() {
            // As hyper does: a length only where a body is expected.
            Some(0) if !expects_body(&parts.method) => Sending::Length(0),
            Some(length) => {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
                out.extend_from_slice(b"\r\n");
                Sending::Length(length)
            }
            None => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Sending::Chunked
            }
        }
    };
    out.extend_from_slice(b"\r\n");
    Ok(sending)
}

fn expects_body(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// Writes `fields` a line each, as a head or a trailer section has them.
fn encode_fields(fields: &HeaderMap, out: &mut Vec<u8>) {
    for (name, value) in fields {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Writes one piece of a chunked body: `data` as a chunk.
pub(crate) fn encode_chunk(data: &[u8], out: &mut Vec<u8>) {
    use std::io::Write as _;
    write!(out, "{:x}\r\n", data.len()).expect("a Vec takes every write");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunked body (no trailers).
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Writes the end of a chunked body with its trailer section.
pub(crate) fn encode_last_chunk(trailers: &HeaderMap, out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n");
    encode_fields(trailers, out);
    out.extend_from_slice(b"\r\n");
}

/// A response's head, parsed.
#[derive(Debug)]
pub(crate) struct Head {
    /// Status, version and headers, as the upstream sent them.
    pub(crate) response: http::Response<()>,
    /// How its body is framed.
    pub(crate) framing: Framing,
    /// The connection may carry another request once the body has ended.
    pub(crate) keep_alive: bool,
}

/// Parses a response head at the start of `buf`, taking it out of `buf`
/// when it is whole (`None`: more bytes are needed). `to_head`: the
/// request was a `HEAD`, whose response has no body whatever it says.
/// Interim (1xx) responses are taken out and passed over.
pub(crate) fn parse_head(buf: &mut BytesMut, to_head: bool) -> Result<Option<Head>, Malformed> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        // Filled by the parser as far as the head has fields: nothing to
        // clear first.
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let length = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut fields,
        ) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
                return Err(Malformed(format!("a head longer than {MAX_HEAD} bytes")))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(Malformed(format!("its head: {e}"))),
        };
        let code = parsed.code.unwrap_or_default();
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        if (100..200).contains(&code) && code != 101 {
            buf.advance(length);
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|_| Malformed(format!("status {code}")))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Malformed(
                "101 Switching Protocols to a request that asked for no upgrade".to_owned(),
            ));
        }
        // Names now, values as slices of the head once it is taken out;
        // the fields that frame the message noted on the way, so that
        // those it lacks are not looked for again.
        let base = buf.as_ptr() as usize;
        let mut named = Vec::with_capacity(parsed.headers.len());
        let mut framed = Framed::default();
        for field in parsed.headers.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes())
                .map_err(|_| Malformed(format!("the header name {:?}", field.name)))?;
            framed.note(&name);
            let start = field.value.as_ptr() as usize - base;
            named.push((name, start, start + field.value.len()));
        }
        let head = buf.split_to(length).freeze();
        let mut headers = HeaderMap::with_capacity(named.len() + HEADROOM);
        for (name, start, end) in named {
            let value = HeaderValue::from_maybe_shared(head.slice(start..end))
                .map_err(|_| Malformed(format!("the value of {name}")))?;
            headers.append(name, value);
        }
        let mut keep_alive = if framed.connection {
            persistent(version, &headers)
        } else {
            version == Version::HTTP_11
        };
        let framing =
            if to_head || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
                Framing::Length(0)
            } else if framed.transfer_encoding {
                // A length beside it is ignored, and the connection not kept
                // (RFC 9112 §6.3).
                if headers.remove(CONTENT_LENGTH).is_some() {
                    keep_alive = false;
                }
                if version == Version::HTTP_11 && chunked_last(&headers) {
                    Framing::Chunked(Chunks::Size)
                } else {
                    keep_alive = false;
                    Framing::Close
                }
            } else if let Some(length) = framed
                .content_length
                .then(|| content_length(&headers))
                .transpose()?
                .flatten()
            {
                Framing::Length(length)
            } else {
                keep_alive = false;
                Framing::Close
            };
        let mut response = http::Response::new(());
        *response.status_mut() = status;
        *response.version_mut() = version;
        *response.headers_mut() = headers;
        return Ok(Some(Head {
            response,
            framing,
            keep_alive,
        }));
    }
}

/// Room a response's header map leaves beyond its own fields. hyper
/// parses the next request on the same connection into the map of the
/// response it last sent (emptied), and the gateway adds its forwarding
/// fields to that request: without the room, the map grows twice a
/// request (BENCHMARKS.md, 2026-12-05).
const HEADROOM: usize = 8;

/// Which of the fields that frame a message a head has.
#[derive(Debug, Default)]
struct Framed {
    connection: bool,
    transfer_encoding: bool,
    content_length: bool,
}

impl Framed {
    fn note(&mut self, name: &HeaderName) {
        if *name == CONTENT_LENGTH {
            self.content_length = true;
        } else if *name == TRANSFER_ENCODING {
            self.transfer_encoding = true;
        } else if *name == CONNECTION {
            self.connection = true;
        }
    }
}

/// Whether the connection stays open after this message (RFC 9112 §9.3).
fn persistent(version: Version, headers: &HeaderMap) -> bool {
    let has = |token: &str| {
        headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    if version == Version::HTTP_11 {
        !has("close")
    } else {
        has("keep-alive")
    }
}

/// Whether the last transfer coding is `chunked`.
fn chunked_last(headers: &HeaderMap) -> bool {
    headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|coding| coding.trim().eq_ignore_ascii_case("chunked"))
}

/// The body's length from `Content-Length`: repeated values must agree
/// (RFC 9110 §8.6).
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Malformed> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for item in value.as_bytes().split(|b| *b == b',') {
            let item = item.trim_ascii();
            let parsed = (!item.is_empty() && item.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(item).ok()?.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| Malformed(format!("Content-Length {value:?}")))?;
            if length.is_some_and(|l| l != parsed) {
                return Err(Malformed("Content-Length values that disagree".to_owned()));
            }
            length = Some(parsed);
        }
    }
    Ok(length)
}

/// How a response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// After this many more bytes.
    Length(u64),
    /// In chunks; where the reading is.
    Chunked(Chunks),
    /// When the upstream closes the connection.
    Close,
}

/// Where a chunked body's reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunks {
    /// Before a chunk's size line.
    Size,
    /// Inside a chunk, this many bytes to go.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk, before the trailer section.
    Trailers,
    /// The body has ended.
    Done,
}

/// What the next piece of a body is.
#[derive(Debug)]
pub(crate) enum Piece {
    /// Bytes of the body.
    Data(Bytes),
    /// The trailer fields, after the last chunk.
    Trailers(HeaderMap),
    /// The body has ended.
    End,
    /// More bytes must be read first.
    More,
}

impl Framing {
    /// The body has ended.
    pub(crate) fn ended(&self) -> bool {
        matches!(self, Self::Length(0) | Self::Chunked(Chunks::Done))
    }

    /// Takes the next piece of the body out of `buf`. The connection's end
    /// is the caller's to tell: it ends a [`Framing::Close`] body, and cuts
    /// any other short.
    pub(crate) fn next(&mut self, buf: &mut BytesMut) -> Result<Piece, Malformed> {
        loop {
            match self {
                Self::Length(0) | Self::Chunked(Chunks::Done) => return Ok(Piece::End),
                Self::Length(left) | Self::Chunked(Chunks::Data(left)) => {
                    if buf.is_empty() {
                        return Ok(Piece::More);
                    }
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                    *left -= n as u64;
                    if let Self::Chunked(chunk @ Chunks::Data(0)) = self {
                        *chunk = Chunks::DataEnd;
                    }
                    return Ok(Piece::Data(buf.split_to(n).freeze()));
                }
                Self::Close => {
                    if buf.is_empty() {
                        return Ok(Piece::More);
                    }
                    return Ok(Piece::Data(buf.split().freeze()));
                }
                // httparse reads a line without digits (`\r\n`, `;x\r\n`)
                // as size 0, which would end the body early.
                Self::Chunked(Chunks::Size)
                    if buf.first().is_some_and(|b| !b.is_ascii_hexdigit()) =>
                {
                    return Err(Malformed("a chunk's size line without a size".to_owned()));
                }
                Self::Chunked(chunk @ Chunks::Size) => match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        buf.advance(used);
                        *chunk = if size == 0 {
                            Chunks::Trailers
                        } else {
                            Chunks::Data(size)
                        };
                    }
                    Ok(httparse::Status::Partial) => return more(buf, "a chunk's size line"),
                    Err(_) => return Err(Malformed("a chunk's size line".to_owned())),
                },
                Self::Chunked(chunk @ Chunks::DataEnd) => {
                    if buf.len() < 2 {
                        return Ok(Piece::More);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(Malformed("a chunk longer than its size".to_owned()));
                    }
                    buf.advance(2);
                    *chunk = Chunks::Size;
                }
                Self::Chunked(chunk @ Chunks::Trailers) => {
                    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
                    let (used, trailers) = match httparse::parse_headers(buf, &mut fields) {
                        Ok(httparse::Status::Complete((used, fields))) => {
                            let mut trailers = HeaderMap::new();
                            for field in fields {
                                let name = HeaderName::from_bytes(field.name.as_bytes());
                                let value = HeaderValue::from_bytes(field.value);
                                if let (Ok(name), Ok(value)) = (name, value) {
                                    trailers.append(name, value);
                                }
                            }
                            (used, trailers)
                        }
                        Ok(httparse::Status::Partial) => return more(buf, "the trailer section"),
                        Err(e) => return Err(Malformed(format!("the trailer section: {e}"))),
                    };
                    buf.advance(used);
                    *chunk = Chunks::Done;
                    if !trailers.is_empty() {
                        return Ok(Piece::Trailers(trailers));
                    }
                }
            }
        }
    }

    /// The body's size, as far as it is known.
    pub(crate) fn size_hint(&self) -> SizeHint {
        match self {
            Self::Length(left) => SizeHint::with_exact(*left),
            Self::Chunked(Chunks::Done) => SizeHint::with_exact(0),
            Self::Chunked(_) | Self::Close => SizeHint::default(),
        }
    }
}

/// More bytes are needed for `what`, unless it is already too long.
fn more(buf: &BytesMut, what: &str) -> Result<Piece, Malformed> {
    if buf.len() >= MAX_LINE {
        return Err(Malformed(format!("{what} longer than {MAX_LINE} bytes")));
    }
    Ok(Piece::More)
}

#[cfg(test)]
mod tests;
