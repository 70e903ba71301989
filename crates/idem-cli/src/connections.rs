//! The accept loop of the binaries' own listeners: each connection, over
//! TLS or not, served by hyper (HTTP/1.1, or HTTP/2 by its preface) with
//! its [`Peer`] (the client's address and the scheme) in every request's
//! extensions, and a graceful stop.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tower::ServiceExt as _;
use tower_service::Service;

use crate::closing::Closing;
use crate::forwarded::Peer;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `service` on `listener`, over TLS when `tls` is given, until
/// `shutdown` resolves; then stops accepting and waits for open
/// connections to finish their requests. Each request carries its
/// connection's `Arc<`[`Peer`]`>` as an extension.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    service: S,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()>
where
    S: Service<http::Request<Incoming>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let closing = Closing::default();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: pause, as axum does.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Who the client is, rendered once for the forwarding headers.
        let client = Arc::new(Peer::new(peer, tls.is_some()));
        let service = service
            .clone()
            .map_request(move |mut request: http::Request<Incoming>| {
                request.extensions_mut().insert(Arc::clone(&client));
                request
            });
        let builder = builder.clone();
        let watcher = closing.watcher();
        let tls = tls.clone();
        closing.spawn(async move {
            let io = match tls {
                None => Either::Left(tcp),
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => Either::Right(tls),
                        Ok(Err(error)) => {
                            tracing::debug!(%error, %peer, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            let connection = builder.serve_connection_with_upgrades(
                TokioIo::new(io),
                TowerToHyperService::new(service),
            );
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(error = %error, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    closing.close().await;
    Ok(())
}
