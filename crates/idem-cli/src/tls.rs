//! The gateway's TLS listener: a certificate chain and key from PEM files,
//! read again on SIGHUP (a renewed certificate takes effect for new
//! connections without a restart; a pair that does not load is reported
//! and the old one kept), HTTP/2 and HTTP/1.1 offered by ALPN.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use axum::Router;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The certificate files of a TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// The private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The certificate the listener presents, replaced by [`reload`](Self::reload).
#[derive(Debug)]
pub struct Certificate {
    files: TlsFiles,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificate {
    /// Loads `files`; an error names the file and what is wrong with it.
    pub fn load(files: TlsFiles) -> anyhow::Result<Arc<Self>> {
        let current = RwLock::new(Arc::new(certified_key(&files)?));
        Ok(Arc::new(Self { files, current }))
    }

    /// Reads the files again and presents the new pair to new
    /// connections. On error the old pair stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let fresh = Arc::new(certified_key(&self.files)?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// The TLS acceptor presenting this certificate, offering HTTP/2 and
    /// HTTP/1.1.
    pub fn acceptor(self: &Arc<Self>) -> TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}

fn certified_key(files: &TlsFiles) -> anyhow::Result<CertifiedKey> {
    let named = |path: &Path, e: &dyn std::fmt::Display| {
        anyhow::anyhow!("--tls-cert/--tls-key {}: {e}", path.display())
    };
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| named(&files.cert, &e))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "--tls-cert {}: no PEM certificate in it",
        files.cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| named(&files.key, &e))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| anyhow::anyhow!("--tls-cert and --tls-key do not make a pair: {e}"))?;
    Ok(certified)
}

/// Reloads `certificate` on every SIGHUP until the process ends.
pub fn reload_on_hangup(certificate: Arc<Certificate>) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("SIGHUP cannot be caught: the certificate is not reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            match certificate.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded"),
                Err(error) => tracing::error!(
                    %error,
                    "SIGHUP: TLS certificate not reloaded; the previous one stays"
                ),
            }
        }
    });
    #[cfg(not(unix))]
    drop(certificate);
}

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then
/// stops accepting and waits for open connections to finish their
/// requests. Each request carries its connection's
/// `Arc<`[`Peer`](crate::forwarded::Peer)`>` as an extension.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    crate::connections::serve(listener, Some(acceptor), app, shutdown).await
}
