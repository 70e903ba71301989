//! `RemoteStore`: an idem [`Store`](idem::Store) over `idem serve`'s claim
//! API, so a program that cannot reach the store itself (or should not
//! hold its credentials) runs idem's own executor against a store another
//! process serves: the same heartbeats, fencing, retries for a whole
//! lease and refusals ended as failures as every other store gets.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, RecordId};
//! use idem_remote::RemoteStore;
//!
//! let store = RemoteStore::builder("http://127.0.0.1:7878")?
//!     .token(std::env::var("IDEM_TOKEN")?)
//!     .build()?;
//! let idem = Idempotency::builder(store).build()?;
//! let id = RecordId::parse("payments", "order-42")?;
//! let receipt = idem
//!     .run(&id, None, |ctx| async move {
//!         let fence = ctx.checked_fence()?;
//!         Ok::<_, idem::LeaseLost>(format!("charged under fence {fence}"))
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! What it maps, and how (docs/design.md §5.5): no answer, a timeout, a 503 (the
//! server's store unavailable) or a bare 5xx from something in front of it
//! are [`StoreError::Unavailable`](idem::StoreError::Unavailable), retried
//! within the lease and read back; a 409 is a lost lease; any other
//! problem the server answers is a definite refusal.
//!
//! Responses and step results cross the API as JSON: use the executor's
//! default `Json` codec. A run's messages ([`Context::send`](idem::Context::send),
//! with [`outbox_sent_by_store`](idem::IdempotencyBuilder::outbox_sent_by_store))
//! go with its completion: the server stores them with the result and
//! sends them (`idem serve --outbox URL`). The API keeps no notification, so waiting for an
//! in-flight duplicate reads the record with a backoff; and an operator
//! resolves a parked step against the store itself, not through this one.

mod client;
mod store;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::{ClientConfig, RootCertStore};

/// How long a call may take, connection included, before it counts as
/// unanswered (and is retried within the lease).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// An idem store served by `idem serve` at a URL. Cheap to clone: clones
/// share one connection pool.
#[derive(Clone)]
pub struct RemoteStore {
    api: Arc<client::Api>,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStore")
            .field("url", &self.api.base)
            .field("token", &self.api.token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// Why a [`RemoteStore`] could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The URL is not an `http://` or `https://` URL of a server.
    #[error("{url:?} is not an idem serve URL: {reason}")]
    Url {
        /// The URL, as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token cannot be sent in a header.
    #[error("the token is not a valid header value (visible ASCII only)")]
    Token,
    /// TLS could not be set up.
    #[error("TLS settings for idem serve")]
    Tls(#[source] rustls::Error),
}

/// Settings for a [`RemoteStore`]; see [`RemoteStore::builder`].
#[derive(Debug)]
pub struct RemoteStoreBuilder {
    base: String,
    token: Option<String>,
    timeout: Duration,
}

impl RemoteStore {
    /// Settings for the claim API at `url` (`http://host:port` or
    /// `https://host:port`, with any path prefix a proxy in front adds).
    /// A token given as the URL's password (`https://:TOKEN@host`) is
    /// sent as the bearer token.
    pub fn builder(url: &str) -> Result<RemoteStoreBuilder, RemoteError> {
        let bad = |reason: &str| RemoteError::Url {
            url: idem::url::redact(url),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(bad("the scheme must be http or https")),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if uri.query().is_some() {
            return Err(bad("a query has no meaning here"));
        }
        let (userinfo, host) = match authority.as_str().rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, authority.as_str()),
        };
        let token = userinfo
            .and_then(|u| u.split_once(':'))
            .map(|(_, password)| {
                percent_decode(password)
                    .ok_or_else(|| bad("the password is not percent-encoded UTF-8"))
            })
            .transpose()?
            .filter(|t| !t.is_empty());
        let scheme = uri.scheme_str().unwrap_or("http");
        let path = uri.path().trim_end_matches('/');
        Ok(RemoteStoreBuilder {
            base: format!("{scheme}://{host}{path}"),
            token,
            timeout: DEFAULT_TIMEOUT,
        })
    }
}

impl RemoteStoreBuilder {
    /// The bearer token, from the server's `--tokens` file: it decides
    /// the tenant whose records this store reaches.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How long a call may take before it counts as unanswered (default
    /// [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The store. Makes no call: the first claim finds out whether the
    /// server answers.
    pub fn build(self) -> Result<RemoteStore, RemoteError> {
        let token = self
            .token
            .map(|t| HeaderValue::try_from(format!("Bearer {t}")).map_err(|_| RemoteError::Token))
            .transpose()?
            .map(|mut value| {
                value.set_sensitive(true);
                value
            });
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(RemoteError::Tls)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(self.timeout));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(RemoteStore {
            api: Arc::new(client::Api {
                client,
                base: self.base,
                token,
                timeout: self.timeout,
            }),
        })
    }
}

/// `%XX`-decoded `text`, if that is UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_the_base_and_a_token_from_the_password() {
        let b = RemoteStore::builder("https://:s%40cret@idem.internal:7878/api/").expect("url");
        assert_eq!(b.base, "https://idem.internal:7878/api");
        assert_eq!(b.token.as_deref(), Some("s@cret"));
        let b = RemoteStore::builder("http://127.0.0.1:7878").expect("url");
        assert_eq!(b.base, "http://127.0.0.1:7878");
        assert_eq!(b.token, None);
        for bad in [
            "redis://127.0.0.1",
            "127.0.0.1:7878",
            "http://h/?token=x",
            "http://",
        ] {
            let error = RemoteStore::builder(bad).expect_err(bad);
            assert!(matches!(error, RemoteError::Url { .. }), "{bad}: {error}");
        }
        let shown = RemoteStore::builder("ftp://:secret@h")
            .expect_err("scheme")
            .to_string();
        assert!(!shown.contains("secret"), "{shown}");
    }
}
