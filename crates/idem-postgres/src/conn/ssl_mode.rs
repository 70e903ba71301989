//! The TLS settings of a `postgres://` URL: libpq's `sslmode` and
//! `sslrootcert`, apart from the connector that uses them (`tls.rs`).

use std::path::PathBuf;

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// Plain TCP.
    Disable,
    /// TLS if the server offers it, else plain; the certificate is
    /// checked as `VerifyCa` when a root certificate file is given.
    Prefer,
    /// TLS; the certificate is not checked, unless a root certificate file
    /// is given: then as `VerifyCa`.
    Require,
    /// TLS, the chain must lead to a trusted root.
    VerifyCa,
    /// TLS, trusted chain and the host name in the certificate.
    VerifyFull,
}

/// `sslrootcert`: what the server's certificate chain must lead to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootCert {
    /// `sslrootcert=system`: the platform's roots (`verify-full` only).
    System,
    /// A PEM file of trusted certificates.
    File(PathBuf),
}

/// How connections are made: `sslmode` and `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    pub(crate) mode: TlsMode,
    /// `None`: none given (the platform's roots, for `verify-full` only).
    pub(crate) root_cert: Option<RootCert>,
}

impl TlsMode {
    pub(crate) fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }
}
