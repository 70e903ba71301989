//! A response as stored for replay, and the compact codec it is stored with.
//! Its stored layouts and how each is read: [`wire`].

mod wire;

pub use wire::Kept;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use idem::{BoxError, Codec};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Headers that describe one connection, not the message (RFC 9110
/// §7.6.1), whether listed here or named by `Connection`. `Trailer` is not
/// one: it names the message's trailer fields, and an HTTP/1.1 peer is
/// sent only the trailers it names.
/// Names, not strings: a string is parsed into a name at each removal.
const HOP_BY_HOP: [HeaderName; 8] = [
    http::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    http::header::TE,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];

/// Removes the hop-by-hop headers from `headers`: those above and those
/// the `Connection` header names. Never stored or replayed; a proxy must
/// not forward them either.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one look at the names present (a handful,
    // most of them compared as standard names) instead of a hashed lookup
    // for each of the eight, three times in each request a gateway runs.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Header fields as stored: names and values in their original order,
/// repeats kept, values byte for byte.
pub(crate) type Fields = Vec<(String, serde_bytes::ByteBuf)>;

/// A response kept for replay: status, end-to-end headers in order (a
/// name may repeat), the body byte for byte, the trailers (gRPC's
/// `grpc-status`, say), and what of the original was kept.
///
/// Its serde form is written for [`Binary`] (postcard) and reads every
/// layout an earlier build stored; see [`Kept`] for the layouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// End-to-end headers in their original order, repeats kept.
    pub headers: Fields,
    /// The body.
    pub body: serde_bytes::ByteBuf,
    /// Trailer fields in their original order; empty when there were none.
    pub trailers: Fields,
    /// What of the original response this holds ([`Kept::Full`] unless a
    /// replay policy kept less).
    pub kept: Kept,
}

impl StoredResponse {
    /// Keeps `status`, the end-to-end part of `headers` (see
    /// [`strip_hop_by_hop`]), and `body`.
    pub fn new(status: StatusCode, mut headers: HeaderMap, body: Bytes) -> Self {
        strip_hop_by_hop(&mut headers);
        Self::end_to_end(status, &headers, &body)
    }

    /// Keeps `status`, `headers` (already without the hop-by-hop ones)
    /// and a copy of `body`, leaving the caller the response it came from.
    pub(crate) fn end_to_end(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Self {
        Self {
            status: status.as_u16(),
            headers: fields(headers),
            body: serde_bytes::ByteBuf::from(body.to_vec()),
            trailers: Vec::new(),
            kept: Kept::Full,
        }
    }

    /// Keeps `trailers` too.
    #[must_use]
    pub fn with_trailers(mut self, trailers: &HeaderMap) -> Self {
        self.trailers = fields(trailers);
        self
    }

    /// At least as many bytes as a response with these headers, a body
    /// of `body_len` bytes and these trailers takes once stored (before
    /// compression), so a response can be checked against the store's
    /// limit before it is encoded.
    pub fn size_bound(headers: &HeaderMap, body_len: usize, trailers: Option<&HeaderMap>) -> usize {
        // Each length is a varint of at most 10 bytes.
        let bound = |fields: &HeaderMap| -> usize {
            fields
                .iter()
                .map(|(name, value)| name.as_str().len() + value.len() + 20)
                .sum()
        };
        48 + bound(headers) + body_len + trailers.map_or(0, bound)
    }

    /// The response again, without its trailers (see
    /// [`trailer_map`](Self::trailer_map)). A stored part that no longer
    /// parses (a record written by something else) is an error, not a
    /// guess.
    pub fn to_response(&self) -> Result<Response<Bytes>, String> {
        let status = StatusCode::from_u16(self.status)
            .map_err(|_| format!("stored status {} is not a status code", self.status))?;
        let mut response = Response::new(Bytes::copy_from_slice(&self.body));
        *response.status_mut() = status;
        *response.headers_mut() = header_map(&self.headers, "header")?;
        Ok(response)
    }

    /// The stored trailers, `None` when there were none.
    pub fn trailer_map(&self) -> Result<Option<HeaderMap>, String> {
        if self.trailers.is_empty() {
            return Ok(None);
        }
        header_map(&self.trailers, "trailer").map(Some)
    }
}

fn fields(map: &HeaderMap) -> Fields {
    map.iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                serde_bytes::ByteBuf::from(value.as_bytes().to_vec()),
            )
        })
        .collect()
}

fn header_map(fields: &Fields, what: &str) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("stored {what} name {name:?} is invalid"))?;
        let value = HeaderValue::from_bytes(value)
            .map_err(|_| format!("stored value of {what} {name} is invalid"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// Stores responses with postcard: compact and binary-safe (JSON would
/// write every body byte as a number). Its format is stable across
/// postcard 1.x.
#[derive(Debug, Clone, Copy, Default)]
pub struct Binary;

impl Codec for Binary {
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        postcard::to_allocvec(value).map_err(Into::into)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        postcard::from_bytes(bytes).map_err(Into::into)
    }
}

/// The layer's codec: [`Binary`], with errors that say which layout a
/// response that does not decode is in.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Responses;

impl Codec for Responses {
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Binary.encode(value)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Binary
            .decode(bytes)
            .map_err(|error| wire::explain(bytes, &*error).into())
    }
}

#[cfg(test)]
mod tests {
    use idem_testkit::fixtures;

    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    (*n).to_owned(),
                    serde_bytes::ByteBuf::from(v.as_bytes().to_vec()),
                )
            })
            .collect()
    }

    fn from_fixture(stored: &[u8]) -> StoredResponse {
        let opened = idem::codec::open(stored, 1 << 20).expect("an envelope");
        Binary.decode(&opened).expect("decodes")
    }

    #[test]
    fn every_earlier_layout_is_read_and_whole_responses_are_written_as_before() {
        let headers = fields(&[
            ("content-type", "application/json"),
            ("location", "/orders/7"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
        ]);
        let layout0 = from_fixture(fixtures::HTTP_RESPONSE_LAYOUT0);
        assert_eq!(
            layout0,
            StoredResponse {
                status: 201,
                headers: headers.clone(),
                body: serde_bytes::ByteBuf::from(fixtures::HTTP_RESPONSE_BODY.to_vec()),
                trailers: Vec::new(),
                kept: Kept::Full,
            }
        );
        let layout1 = from_fixture(fixtures::HTTP_RESPONSE_LAYOUT1);
        assert_eq!(
            layout1,
            StoredResponse {
                trailers: fields(&[("x-checksum", "c0ffee"), ("x-checksum", "again")]),
                ..layout0
            }
        );
        // A response kept whole is written in layout 1, byte for byte, so
        // a build from before policies replays it during a rolling upgrade.
        assert_eq!(
            Binary.encode(&layout1).expect("encodes"),
            &fixtures::HTTP_RESPONSE_LAYOUT1[1..]
        );
    }

    #[test]
    fn reduced_responses_are_written_in_layout_2_and_newer_layouts_are_refused() {
        let mut reduced = from_fixture(fixtures::HTTP_RESPONSE_LAYOUT1);
        reduced.body = serde_bytes::ByteBuf::new();
        reduced.kept = Kept::StatusOnly;
        let encoded = Binary.encode(&reduced).expect("encodes");
        assert_eq!(encoded[0], 2, "layout 2 names itself");
        assert_eq!(
            Binary.decode::<StoredResponse>(&encoded).expect("decodes"),
            reduced
        );
        for status in [100u16, 127, 128, 200, 599, 999] {
            let whole = StoredResponse {
                status,
                kept: Kept::Full,
                ..reduced.clone()
            };
            let bytes = Binary.encode(&whole).expect("encodes");
            assert!(bytes[0] >= 0x64, "a status never begins below 0x64");
            assert_eq!(
                Binary.decode::<StoredResponse>(&bytes).expect("decodes"),
                whole
            );
        }
        let newer = Responses
            .decode::<StoredResponse>(&[5, 1, 2, 3])
            .expect_err("layout 5 is not known");
        assert!(newer.to_string().contains("layout 5"), "{newer}");
        assert!(Binary.decode::<StoredResponse>(&[]).is_err());
        assert!(Binary.decode::<StoredResponse>(&[0xc9]).is_err());
    }

    #[test]
    fn hop_by_hop_headers_are_dropped_and_repeats_and_trailers_kept() {
        let mut headers = HeaderMap::new();
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("connection", HeaderValue::from_static("close, x-private"));
        headers.append("x-private", HeaderValue::from_static("hop"));
        headers.append("transfer-encoding", HeaderValue::from_static("chunked"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.append(
            "x-bin",
            HeaderValue::from_bytes(&[0xff, b'a']).expect("value"),
        );
        let mut trailers = HeaderMap::new();
        trailers.append("grpc-status", HeaderValue::from_static("0"));
        trailers.append("x-t", HeaderValue::from_static("1"));
        trailers.append("x-t", HeaderValue::from_static("2"));
        let stored = StoredResponse::new(
            StatusCode::CREATED,
            headers,
            Bytes::from_static(&[0, 1, 255]),
        )
        .with_trailers(&trailers);
        let encoded = Binary.encode(&stored).expect("encode");
        let decoded: StoredResponse = Binary.decode(&encoded).expect("decode");
        assert_eq!(decoded.trailer_map().expect("valid"), Some(trailers));
        let response = decoded.to_response().expect("valid");
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.body().as_ref(), &[0, 1, 255]);
        let cookies: Vec<_> = response.headers().get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(response.headers()["x-bin"].as_bytes(), &[0xff, b'a']);
        for gone in ["connection", "x-private", "transfer-encoding"] {
            assert!(
                !response.headers().contains_key(gone),
                "{gone} must be dropped"
            );
        }
    }
}
