//! The accept loop of the binaries' own listeners: each connection, over
//! TLS or not, served by hyper (HTTP/1.1, or HTTP/2 by its preface) with
//! its [`Peer`] (the client's address and the scheme) in every request's
//! extensions, and a graceful stop. Once its body is in, an HTTP/1.1
//! request runs to its end whether or not its client is still there
//! (HTTP/2 cancels a request whose stream is reset or whose connection
//! is lost; covered requests run detached all the same).

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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper otherwise reads a busy HTTP/1.1 connection while its request
    // runs, to close it at the client's end: a client that half-closes
    // after its request never got the answer, a request passed through
    // was cut off mid-flight at the upstream (covered ones run detached
    // anyway: DESIGN §5 item 4, §8), and each request paid a read buffer
    // and three polls for it. A client that is gone is found when it is
    // next written to.
    builder.http1().half_close(true);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Answers `200 ok` with the client's address and scheme as the
    /// request's `Peer` says.
    fn echo_peer() -> impl Service<
        http::Request<Incoming>,
        Response = http::Response<String>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
           + Send
           + 'static {
        tower::service_fn(|request: http::Request<Incoming>| async move {
            let peer = request.extensions().get::<std::sync::Arc<Peer>>();
            let body = peer.map_or_else(
                || "no peer".to_owned(),
                |p| format!("{} {}", p.addr.ip(), p.scheme()),
            );
            Ok::<_, Infallible>(http::Response::new(body))
        })
    }

    async fn exchange(stream: &mut TcpStream) -> String {
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: gateway\r\n\r\n")
            .await
            .expect("write");
        let mut seen = Vec::new();
        let mut buf = [0; 1024];
        while !seen.ends_with(b"http") {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&seen).into_owned()
    }

    /// An idle kept-alive connection is closed by the stop, and the accept
    /// loop returns once it is; its requests carried their peer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_stop_closes_idle_connections_and_waits_for_them() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(listener, None, echo_peer(), async {
            let _ = stopped.await;
        }));
        let mut idle = TcpStream::connect(address).await.expect("connect");
        let answer = exchange(&mut idle).await;
        assert!(answer.ends_with("127.0.0.1 http"), "{answer}");
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the loop returned")
            .expect("task")
            .expect("served");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "the idle connection was closed: {read:?}"
        );
    }

    /// An accept loop dropped before its stop (its task aborted) stops its
    /// connections too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_loop_stops_its_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let served = tokio::spawn(serve(
            listener,
            None,
            echo_peer(),
            std::future::pending::<()>(),
        ));
        let mut idle = TcpStream::connect(address).await.expect("connect");
        exchange(&mut idle).await;
        served.abort();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), idle.read_to_end(&mut rest)).await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "the idle connection was closed: {read:?}"
        );
    }
}
