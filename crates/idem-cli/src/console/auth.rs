//! Who may use the console: the holder of the admin token. A browser
//! signs in once and keeps a session cookie; a script sends the token as
//! a bearer. Every change is a POST that carries the form token, so a
//! page of another site cannot make a signed-in browser act.

use axum::http::{header, HeaderMap};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "idem_console";

/// How long a browser stays signed in.
pub(crate) const SESSION: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// The shortest admin token accepted.
const SHORTEST: usize = 16;

/// The admin token, checked: at least 16 characters, no whitespace or
/// control characters (it travels in a header and a cookie).
#[derive(Clone)]
pub struct AdminToken(String);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(…)")
    }
}

impl AdminToken {
    /// The token, or why it cannot be one.
    pub fn new(token: &str) -> anyhow::Result<Self> {
        let token = token.trim();
        anyhow::ensure!(
            token.chars().count() >= SHORTEST,
            "the admin token is {} characters; it needs at least {SHORTEST} \
             (`openssl rand -hex 16` makes one)",
            token.chars().count()
        );
        anyhow::ensure!(
            !token.chars().any(|c| c.is_whitespace() || c.is_control()),
            "the admin token holds whitespace or a control character"
        );
        Ok(Self(token.to_owned()))
    }

    /// A new random token (32 hex digits), for a console started without
    /// one.
    pub fn random() -> Self {
        Self(hex::encode(rand::random::<[u8; 16]>()))
    }

    /// The token itself, to print once for whoever started the console.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    fn mac(&self, purpose: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.0.as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(purpose);
        mac
    }

    fn derived(&self, purpose: &[u8]) -> String {
        hex::encode(self.mac(purpose).finalize().into_bytes())
    }

    fn is_derived(&self, purpose: &[u8], given: &str) -> bool {
        hex::decode(given).is_ok_and(|bytes| self.mac(purpose).verify_slice(&bytes).is_ok())
    }

    /// A session cookie's value for a sign-in at `issued` (seconds since
    /// the epoch): the time and a MAC of it under the token, so it holds no
    /// state, lapses after [`SESSION`], and every session ends when the
    /// token changes.
    pub(crate) fn session_at(&self, issued: u64) -> String {
        let mut purpose = b"idem.console.session.v1\0".to_vec();
        purpose.extend_from_slice(&issued.to_be_bytes());
        format!("{issued}.{}", self.derived(&purpose))
    }

    /// Whether `value` is a session cookie of this token issued within
    /// [`SESSION`] before `now` (seconds since the epoch).
    fn is_session(&self, value: &str, now: u64) -> bool {
        let Some((issued, mac)) = value.split_once('.') else {
            return false;
        };
        let Ok(issued) = issued.parse::<u64>() else {
            return false;
        };
        let mut purpose = b"idem.console.session.v1\0".to_vec();
        purpose.extend_from_slice(&issued.to_be_bytes());
        issued <= now.saturating_add(60)
            && now.saturating_sub(issued) < SESSION.as_secs()
            && self.is_derived(&purpose, mac)
    }

    /// The token every form carries (and every POST must bring back).
    pub(crate) fn form_token(&self) -> String {
        self.derived(b"idem.console.form.v1")
    }

    /// Whether `given` is the form token (compared in constant time).
    pub(crate) fn is_form_token(&self, given: &str) -> bool {
        self.is_derived(b"idem.console.form.v1", given)
    }

    /// Whether `given` is the token (compared in constant time).
    pub(crate) fn is_token(&self, given: &str) -> bool {
        self.is_derived(
            b"idem.console.token.v1",
            &Self(given.to_owned()).derived(b"idem.console.token.v1"),
        )
    }

    /// Whether the request is signed in: the session cookie, or the token
    /// as a bearer.
    pub(crate) fn admits(&self, headers: &HeaderMap) -> bool {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|b| self.is_token(b.trim())) {
            return true;
        }
        cookies(headers)
            .filter(|(name, _)| *name == COOKIE)
            .any(|(_, value)| self.is_session(value, now_secs()))
    }

    /// The `Set-Cookie` that signs a browser in: only for the console's
    /// paths, unreadable by scripts, never sent with a request another
    /// site starts.
    pub(crate) fn sign_in_cookie(&self) -> String {
        format!(
            "{COOKIE}={}; Path=/console; Max-Age={}; HttpOnly; SameSite=Strict",
            self.session_at(now_secs()),
            SESSION.as_secs()
        )
    }
}

/// The `Set-Cookie` that signs a browser out.
pub(crate) fn sign_out_cookie() -> String {
    format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Now, in seconds since the epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The request's cookies, as name and value.
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            Some((name.trim(), value.trim()))
        })
}

/// Whether a POST comes from the console's own pages: a browser names
/// the page's origin in `Origin` (or says `Sec-Fetch-Site`); one from
/// another origin is refused even with the form token. Requests without
/// either (scripts, old browsers) are judged by the form token alone.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return matches!(site, "same-origin" | "none");
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((origin_host, host), (Some(o), Some(h)) if o == h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn token() -> AdminToken {
        AdminToken::new("correct-horse-battery-staple").expect("token")
    }

    #[test]
    fn short_or_spaced_tokens_are_refused_with_the_reason() {
        let short = AdminToken::new("hunter2").expect_err("short");
        assert!(short.to_string().contains("at least 16"), "{short}");
        let spaced = AdminToken::new("correct horse battery").expect_err("spaced");
        assert!(spaced.to_string().contains("whitespace"), "{spaced}");
        assert_eq!(AdminToken::random().reveal().len(), 32);
    }

    #[test]
    fn only_the_token_or_its_session_cookie_signs_in() {
        let token = token();
        let mut headers = HeaderMap::new();
        assert!(!token.admits(&headers));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer wrong-token-of-some-length"),
        );
        assert!(!token.admits(&headers));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer correct-horse-battery-staple"),
        );
        assert!(token.admits(&headers));
        let mut headers = HeaderMap::new();
        let cookie = format!("other=1; {COOKIE}={}", token.session_at(now_secs()));
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&cookie).expect("cookie"),
        );
        assert!(token.admits(&headers));
        let other = AdminToken::new("another-token-entirely").expect("token");
        assert!(!other.admits(&headers), "a cookie of another token");
        assert!(token.is_form_token(&token.form_token()));
        assert!(
            !token.is_form_token(&token.session_at(now_secs())),
            "the cookie is not the form token"
        );
    }

    #[test]
    fn a_session_lapses_and_cannot_be_moved_to_another_time() {
        let token = token();
        let now = 1_800_000_000;
        let cookie = token.session_at(now);
        assert!(token.is_session(&cookie, now + 3600));
        assert!(
            !token.is_session(&cookie, now + SESSION.as_secs()),
            "lapsed"
        );
        assert!(
            !token.is_session(&cookie, now - 3600),
            "issued in the future"
        );
        let (_, mac) = cookie.split_once('.').expect("mac");
        assert!(
            !token.is_session(&format!("{}.{mac}", now + 7200), now + 7200),
            "re-dated"
        );
        assert!(!token.is_session("garbage", now));
    }

    #[test]
    fn a_post_from_another_origin_is_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9090"));
        assert!(same_origin(&headers), "no Origin: a script");
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9090"),
        );
        assert!(same_origin(&headers));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!same_origin(&headers));
        headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&headers));
    }
}
