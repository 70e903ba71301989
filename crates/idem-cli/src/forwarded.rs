//! What the gateway tells the upstream about the request, as reverse
//! proxies do: who sent it (`Forwarded: for=`, `X-Forwarded-For`), over
//! which scheme (`proto`, `X-Forwarded-Proto`) and to which host (`host`,
//! `X-Forwarded-Host`), and which `Host` the upstream sees.

use std::net::SocketAddr;

use http::header::{Entry, HeaderMap, HeaderName, HeaderValue, FORWARDED, HOST};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The forwarding headers, this gateway's and those other proxies use to
/// say who the client is (which this gateway does not set: a client's own
/// would reach the upstream as if vouched for), all dropped when the
/// incoming ones are not trusted.
const UNVOUCHED: [HeaderName; 11] = [
    FORWARDED,
    X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
    X_FORWARDED_HOST,
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("true-client-ip"),
];

/// Whether `name` is one of [`UNVOUCHED`]: each begins with `f`, `t` or
/// `x`, which most names a request carries do not.
fn unvouched(name: &HeaderName) -> bool {
    matches!(name.as_str().as_bytes().first(), Some(b'f' | b't' | b'x')) && UNVOUCHED.contains(name)
}

/// How the gateway treats forwarding headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardedPolicy {
    /// Keep `Forwarded` and `X-Forwarded-*` from the client and add this
    /// hop to them: only behind a proxy that sets them itself. Otherwise
    /// they are replaced by what this gateway saw, so a client cannot make
    /// the upstream believe it came from elsewhere.
    pub trust_incoming: bool,
    /// Send the client's `Host` on (the default); otherwise the upstream's
    /// own authority, for upstreams that route by it.
    pub preserve_host: bool,
}

impl Default for ForwardedPolicy {
    fn default() -> Self {
        Self {
            trust_incoming: false,
            preserve_host: true,
        }
    }
}

/// Who a connection's requests come from, as the forwarding headers write
/// it: rendered once a connection, carried in each request's extensions
/// (as `Arc<Peer>`) by the accept loop.
#[derive(Debug)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The connection came over TLS.
    pub https: bool,
    /// The client's IP address, as `X-Forwarded-For` lists it.
    ip: HeaderValue,
    /// `Forwarded`'s `for=` parameter and its separator: `for=192.0.2.7;`,
    /// `for="[2001:db8::1]";` (RFC 7239 §6).
    for_param: String,
}

impl Peer {
    /// The client at `addr`, connected over TLS if `https`.
    pub fn new(addr: SocketAddr, https: bool) -> Self {
        let ip = addr.ip().to_string();
        let mut for_param = String::with_capacity(ip.len() + 8);
        for_param.push_str("for=");
        if addr.is_ipv6() {
            push_value(&mut for_param, &format!("[{ip}]"));
        } else {
            push_value(&mut for_param, &ip);
        }
        for_param.push(';');
        Self {
            addr,
            https,
            ip: HeaderValue::from_maybe_shared(bytes::Bytes::from(ip))
                .expect("an IP address is a valid header value"),
            for_param,
        }
    }

    /// The scheme the client used.
    pub fn scheme(&self) -> &'static str {
        if self.https {
            "https"
        } else {
            "http"
        }
    }
}

/// Adds this hop to `headers` (a request about to be forwarded to the
/// upstream at `upstream_authority`), received from `peer` (over `http`
/// when there is none).
pub(crate) fn apply(
    headers: &mut HeaderMap,
    peer: Option<&Peer>,
    upstream_authority: &str,
    policy: ForwardedPolicy,
) {
    let scheme = peer.map_or("http", Peer::scheme);
    let host = headers.get(HOST).cloned();
    // Room for the four fields below at once, not a growth for each.
    headers.reserve(4);
    // Most requests carry none: one look at the names present instead of a
    // hashed lookup for each of the eleven.
    if !policy.trust_incoming && headers.keys().any(unvouched) {
        for name in UNVOUCHED {
            headers.remove(name);
        }
    }
    if let Some(peer) = peer {
        append(headers, X_FORWARDED_FOR, peer.ip.clone());
    }
    headers
        .entry(X_FORWARDED_PROTO)
        .or_insert_with(|| HeaderValue::from_static(scheme));
    if let Some(host) = &host {
        headers
            .entry(X_FORWARDED_HOST)
            .or_insert_with(|| host.clone());
    }
    // RFC 7239: for=<node>;host=<host>;proto=<scheme>, one element a hop.
    let mut element = String::with_capacity(64);
    if let Some(peer) = peer {
        element.push_str(&peer.for_param);
    }
    if let Some(host) = host.as_ref().and_then(|h| h.to_str().ok()) {
        element.push_str("host=");
        push_value(&mut element, host);
        element.push(';');
    }
    element.push_str("proto=");
    element.push_str(scheme);
    if let Ok(element) = HeaderValue::from_maybe_shared(bytes::Bytes::from(element)) {
        append(headers, FORWARDED, element);
    }
    if !policy.preserve_host {
        if let Ok(authority) = HeaderValue::from_str(upstream_authority) {
            headers.insert(HOST, authority);
        }
    }
}

/// Adds `value` to the list in header `name`, written as one
/// comma-separated value as proxies write these lists; a list that came
/// in several header lines is joined in order (RFC 9110 §5.3).
fn append(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    let mut present = match headers.entry(name) {
        Entry::Vacant(vacant) => {
            vacant.insert(value);
            return;
        }
        Entry::Occupied(present) => present,
    };
    let mut parts: Vec<String> = present
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    parts.push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    if let Ok(joined) = HeaderValue::from_str(&parts.join(", ")) {
        present.insert(joined);
    }
}

/// Writes a `Forwarded` parameter value to `out`: a token as it is,
/// anything else quoted (RFC 7239 §4: an IPv6 address or a host with a
/// port must be quoted).
fn push_value(out: &mut String, value: &str) {
    if !value.is_empty() && value.bytes().all(is_tchar) {
        out.push_str(value);
        return;
    }
    out.push('"');
    let mut rest = value;
    // Both escaped characters are ASCII: their byte offsets are char
    // boundaries.
    while let Some(at) = rest.bytes().position(|b| b == b'\\' || b == b'"') {
        out.push_str(&rest[..at]);
        out.push('\\');
        out.push_str(&rest[at..=at]);
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

/// A token character (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(incoming: &[(&str, &str)], client: &str, policy: ForwardedPolicy) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in incoming {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        let peer = client.parse().ok().map(|addr| Peer::new(addr, false));
        apply(&mut headers, peer.as_ref(), "10.0.0.9:3000", policy);
        headers
    }

    fn get<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
        headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn a_hop_is_added_and_spoofed_headers_are_replaced() {
        let h = forwarded(
            &[
                ("host", "api.example.com"),
                ("x-forwarded-for", "6.6.6.6"),
                ("forwarded", "for=6.6.6.6"),
                ("x-forwarded-proto", "https"),
            ],
            "192.0.2.7:5123",
            ForwardedPolicy::default(),
        );
        assert_eq!(get(&h, "x-forwarded-for"), Some("192.0.2.7"));
        assert_eq!(get(&h, "x-forwarded-proto"), Some("http"));
        assert_eq!(get(&h, "x-forwarded-host"), Some("api.example.com"));
        assert_eq!(
            get(&h, "forwarded"),
            Some("for=192.0.2.7;host=api.example.com;proto=http")
        );
        assert_eq!(get(&h, "host"), Some("api.example.com"));
    }

    #[test]
    fn a_chain_in_several_lines_is_kept_whole_and_other_claims_are_dropped() {
        let trusted = forwarded(
            &[
                ("x-forwarded-for", "198.51.100.1"),
                ("x-forwarded-for", "198.51.100.2"),
            ],
            "192.0.2.7:1",
            ForwardedPolicy {
                trust_incoming: true,
                preserve_host: true,
            },
        );
        assert_eq!(
            get(&trusted, "x-forwarded-for"),
            Some("198.51.100.1, 198.51.100.2, 192.0.2.7")
        );
        let untrusted = forwarded(
            &[("x-real-ip", "6.6.6.6"), ("true-client-ip", "6.6.6.6")],
            "192.0.2.7:1",
            ForwardedPolicy::default(),
        );
        assert_eq!(get(&untrusted, "x-real-ip"), None);
        assert_eq!(get(&untrusted, "true-client-ip"), None);
    }

    #[test]
    fn a_host_that_is_no_token_is_quoted_with_its_quotes_escaped() {
        let h = forwarded(
            &[("host", r#"odd"host\name"#)],
            "192.0.2.7:1",
            ForwardedPolicy::default(),
        );
        assert_eq!(
            get(&h, "forwarded"),
            Some(r#"for=192.0.2.7;host="odd\"host\\name";proto=http"#)
        );
    }

    #[test]
    fn behind_a_trusted_proxy_the_chain_grows() {
        let h = forwarded(
            &[
                ("host", "api.example.com:8443"),
                ("x-forwarded-for", "198.51.100.1"),
                ("forwarded", "for=198.51.100.1;proto=https"),
                ("x-forwarded-proto", "https"),
            ],
            "[2001:db8::1]:443",
            ForwardedPolicy {
                trust_incoming: true,
                preserve_host: false,
            },
        );
        assert_eq!(
            get(&h, "x-forwarded-for"),
            Some("198.51.100.1, 2001:db8::1")
        );
        assert_eq!(get(&h, "x-forwarded-proto"), Some("https"));
        assert_eq!(
            get(&h, "forwarded"),
            Some(
                "for=198.51.100.1;proto=https, \
                 for=\"[2001:db8::1]\";host=\"api.example.com:8443\";proto=http"
            )
        );
        assert_eq!(get(&h, "host"), Some("10.0.0.9:3000"));
    }
}
