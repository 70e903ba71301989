//! What the gateway tells the upstream about the request, as reverse
//! proxies do: who sent it (`Forwarded: for=`, `X-Forwarded-For`), over
//! which scheme (`proto`, `X-Forwarded-Proto`) and to which host (`host`,
//! `X-Forwarded-Host`), and which `Host` the upstream sees.

use std::net::SocketAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue, FORWARDED, HOST};

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

/// Adds this hop to `headers` (a request about to be forwarded to the
/// upstream at `upstream_authority`), received from `client` over
/// `scheme`.
pub(crate) fn apply(
    headers: &mut HeaderMap,
    client: Option<SocketAddr>,
    scheme: &'static str,
    upstream_authority: &str,
    policy: ForwardedPolicy,
) {
    let host = headers.get(HOST).cloned();
    // Most requests carry none: one look at the names present instead of a
    // hashed lookup for each of the eleven.
    if !policy.trust_incoming && headers.keys().any(|name| UNVOUCHED.contains(name)) {
        for name in UNVOUCHED {
            headers.remove(name);
        }
    }
    let ip = client.map(|c| c.ip().to_string());
    if let Some(ip) = &ip {
        append(headers, X_FORWARDED_FOR, ip);
    }
    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
    }
    if let Some(host) = &host {
        if !headers.contains_key(X_FORWARDED_HOST) {
            headers.insert(X_FORWARDED_HOST, host.clone());
        }
    }
    // RFC 7239: for=<node>;host=<host>;proto=<scheme>, one element a hop.
    let mut element = String::with_capacity(64);
    if let (Some(ip), Some(client)) = (&ip, client) {
        element.push_str("for=");
        if client.is_ipv6() {
            push_value(&mut element, &format!("[{ip}]"));
        } else {
            push_value(&mut element, ip);
        }
        element.push(';');
    }
    if let Some(host) = host.as_ref().and_then(|h| h.to_str().ok()) {
        element.push_str("host=");
        push_value(&mut element, host);
        element.push(';');
    }
    element.push_str("proto=");
    element.push_str(scheme);
    append(headers, FORWARDED, &element);
    if !policy.preserve_host {
        if let Ok(authority) = HeaderValue::from_str(upstream_authority) {
            headers.insert(HOST, authority);
        }
    }
}

/// Adds `value` to the list in header `name`, written as one
/// comma-separated value as proxies write these lists; a list that came
/// in several header lines is joined in order (RFC 9110 §5.3).
fn append(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    if !headers.contains_key(&name) {
        if let Ok(value) = HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
        return;
    }
    let mut parts: Vec<String> = headers
        .get_all(&name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    parts.push(value.to_owned());
    if let Ok(joined) = HeaderValue::from_str(&parts.join(", ")) {
        headers.insert(name, joined);
    }
}

/// Writes a `Forwarded` parameter value to `out`: a token as it is,
/// anything else quoted (RFC 7239 §4: an IPv6 address or a host with a
/// port must be quoted).
fn push_value(out: &mut String, value: &str) {
    let token = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        out.push_str(value);
        return;
    }
    out.push('"');
    for c in value.chars() {
        if c == '\\' || c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
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
        apply(
            &mut headers,
            client.parse().ok(),
            "http",
            "10.0.0.9:3000",
            policy,
        );
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
