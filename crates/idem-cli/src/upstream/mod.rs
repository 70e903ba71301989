//! The gateway's client for its upstream: `http://` or `https://`
//! (rustls with ring; the platform's root certificates, plus those of a
//! private CA file), HTTP/1.1 or HTTP/2 (negotiated by ALPN over TLS, or
//! spoken in cleartext with prior knowledge when asked: h2c).
//!
//! HTTP/1.1 to an `http://` upstream, the common case, goes through
//! `pool`, whose connections each request reads and writes itself, in
//! bytes (`h1`); TLS and HTTP/2 through hyper-util's client, whose
//! connections are tasks of their own (an HTTP/2 connection is shared by
//! many requests at once).

mod h1;
mod pool;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::Uri;
use http_body_util::Either;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use idem::BoxError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// The client the gateway forwards with.
#[derive(Clone)]
pub struct UpstreamClient {
    kind: Kind,
    /// The upstream URL's path without its trailing slash: each request's
    /// path goes after it.
    prefix: String,
    /// The upstream's scheme and authority, for absolute URIs.
    origin: String,
}

#[derive(Clone)]
enum Kind {
    /// HTTP/1.1 in cleartext.
    Pooled(pool::Pool),
    /// TLS, or HTTP/2.
    Shared(Box<Client<Timed<HttpsConnector<HttpConnector>>, Body>>),
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Pooled(_) => "HTTP/1.1 pool",
            Kind::Shared(_) => "hyper-util client",
        };
        f.debug_struct("UpstreamClient")
            .field("kind", &kind)
            .field("upstream", &format_args!("{}{}", self.origin, self.prefix))
            .finish()
    }
}

impl UpstreamClient {
    /// Sends `request` to the upstream, at the upstream URL's path
    /// followed by the request's path and query, and returns its
    /// response, whose body streams from the upstream.
    pub async fn request(
        &self,
        mut request: http::Request<Body>,
    ) -> Result<http::Response<UpstreamBody>, UpstreamError> {
        let path = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
        let uri = match &self.kind {
            Kind::Pooled(_) if self.prefix.is_empty() => Ok(Uri::from(
                request
                    .uri()
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
            )),
            Kind::Pooled(_) => format!("{}{path}", self.prefix).parse(),
            Kind::Shared(_) => format!("{}{}{path}", self.origin, self.prefix).parse(),
        };
        *request.uri_mut() = uri.map_err(|e| UpstreamError {
            connect: true,
            source: format!("cannot build the upstream URL for {path:?}: {e}").into(),
        })?;
        match &self.kind {
            Kind::Pooled(pool) => match pool.send(request).await {
                Ok(response) => Ok(response.map(Either::Left)),
                Err(pool::Failed::Connect(e)) => Err(UpstreamError {
                    connect: true,
                    source: e.into(),
                }),
                Err(pool::Failed::Sent(e)) => Err(UpstreamError {
                    connect: false,
                    source: e,
                }),
            },
            Kind::Shared(client) => match client.request(request).await {
                Ok(response) => Ok(response.map(Either::Right)),
                Err(e) => Err(UpstreamError {
                    connect: e.is_connect(),
                    source: e.into(),
                }),
            },
        }
    }
}

/// Why the upstream gave no response.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct UpstreamError {
    connect: bool,
    source: BoxError,
}

impl UpstreamError {
    /// No connection could be made: nothing was sent.
    pub fn is_connect(&self) -> bool {
        self.connect
    }
}

/// The body of an upstream's response: from the pool, or from
/// hyper-util's client.
pub type UpstreamBody = Either<pool::Driven, Incoming>;

/// How the gateway talks to its upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamProtocol {
    /// PEM certificates of a private CA trusted for `https://` upstreams,
    /// besides the platform's roots.
    pub ca_file: Option<PathBuf>,
    /// Speak HTTP/2 only: h2c with prior knowledge to an `http://`
    /// upstream (gRPC servers, say), h2 to an `https://` one. Without it,
    /// `https://` upstreams get HTTP/2 when they offer it (ALPN) and
    /// `http://` ones HTTP/1.1.
    pub http2_only: bool,
}

/// The client for `upstream` spoken as `protocol`. Connecting, TLS
/// handshake included, is limited to `connect_timeout`, so an upstream
/// that is down or never finishes its handshake is told apart (nothing was
/// sent) from one that took the request and never answered.
pub fn client(
    upstream: &Uri,
    protocol: &UpstreamProtocol,
    connect_timeout: Duration,
) -> anyhow::Result<UpstreamClient> {
    // Built for a pooled upstream too: a CA file that cannot work is
    // refused at start-up whichever client ends up forwarding.
    let shared = shared_client(protocol, connect_timeout)?;
    let authority = upstream
        .authority()
        .ok_or_else(|| anyhow::anyhow!("the upstream {upstream} names no host"))?;
    let scheme = upstream.scheme_str().unwrap_or("http");
    let kind = if scheme == "http" && !protocol.http2_only {
        let port = authority.port_u16().unwrap_or(80);
        Kind::Pooled(pool::Pool::new(
            format!("{}:{port}", authority.host()),
            connect_timeout,
        ))
    } else {
        Kind::Shared(Box::new(shared))
    };
    Ok(UpstreamClient {
        kind,
        prefix: upstream.path().trim_end_matches('/').to_owned(),
        origin: format!("{scheme}://{authority}"),
    })
}

fn shared_client(
    protocol: &UpstreamProtocol,
    connect_timeout: Duration,
) -> anyhow::Result<Client<Timed<HttpsConnector<HttpConnector>>, Body>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("TLS settings for the upstream: {e}"))?
        .with_root_certificates(roots(protocol.ca_file.as_deref())?)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .http2_only(protocol.http2_only)
        .build(Timed {
            inner: connector,
            limit: connect_timeout,
        }))
}

/// The platform's root certificates and those in `ca_file`. An unreadable
/// or empty CA file is an error at start-up, not a failed handshake later.
fn roots(ca_file: Option<&Path>) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!(%error, "a platform root certificate could not be read");
    }
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| anyhow::anyhow!("--upstream-ca {}: {e}", path.display()))?;
        anyhow::ensure!(
            !certs.is_empty(),
            "--upstream-ca {}: no PEM certificate in it",
            path.display()
        );
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| anyhow::anyhow!("--upstream-ca {}: {e}", path.display()))?;
        }
    }
    Ok(roots)
}

/// A connector whose whole connect (TCP and TLS) has a time limit.
#[derive(Debug, Clone)]
pub struct Timed<C> {
    inner: C,
    limit: Duration,
}

impl<C> tower_service::Service<Uri> for Timed<C>
where
    C: tower_service::Service<Uri> + Send,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let limit = self.limit;
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(format!("no connection within {limit:?}").into()),
            }
        })
    }
}
