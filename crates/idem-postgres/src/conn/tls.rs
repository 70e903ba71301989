//! TLS for `postgres://` URLs (the `tls` feature): rustls with ring, set
//! up from the libpq `sslmode` and `sslrootcert` parameters.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::ssl_mode::{RootCert, Tls, TlsMode};

/// The connector for `tls` (any mode but `disable`).
pub(crate) fn connector(tls: &Tls) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?;
    // libpq: `prefer` and `require` with a root certificate file check the
    // chain, as `verify-ca`.
    let mode = match (tls.mode, &tls.root_cert) {
        (TlsMode::Prefer | TlsMode::Require, Some(RootCert::File(_))) => TlsMode::VerifyCa,
        (mode, _) => mode,
    };
    let config = match mode {
        TlsMode::Disable | TlsMode::Prefer | TlsMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth(),
        TlsMode::VerifyCa => {
            let roots = Arc::new(roots(tls)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| format!("TLS set-up: {e}"))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
                .with_no_client_auth()
        }
        TlsMode::VerifyFull => builder
            .with_root_certificates(roots(tls)?)
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

/// The trusted roots: the `sslrootcert` file, or the platform's.
fn roots(tls: &Tls) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match &tls.root_cert {
        Some(RootCert::File(path)) => {
            let shown = path.display();
            let pem = std::fs::read(path).map_err(|e| format!("sslrootcert {shown}: {e}"))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| format!("sslrootcert {shown}: {e}"))?;
                store
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
            }
            if store.is_empty() {
                return Err(format!("sslrootcert {shown} holds no certificate"));
            }
        }
        Some(RootCert::System) | None => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(
                    "no root certificates found on this machine: give sslrootcert=PATH".into(),
                );
            }
        }
    }
    Ok(store)
}

/// `verify-ca`: the chain must lead to a trusted root; the name in the
/// certificate is not checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` (libpq's meaning): encrypted, but the server's
/// certificate is not checked, so an active attacker can sit in between.
/// The handshake signatures are still verified.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
