//! `ssl-mode` and `ssl-ca`, as the `mysql` client reads them, into the
//! driver's TLS settings.

use std::path::PathBuf;

/// How a connection is encrypted, by the URL's `ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// `DISABLED` (the default): plain TCP.
    Disabled,
    /// `REQUIRED`: encrypted; the server's certificate is not checked,
    /// unless `ssl-ca` names a file, which makes it `VERIFY_CA`.
    Required,
    /// `VERIFY_CA`: encrypted, the certificate chains to a root in the
    /// `ssl-ca` file; the host name is not checked.
    VerifyCa,
    /// `VERIFY_IDENTITY`: encrypted, the certificate chains to a trusted
    /// root (the `ssl-ca` file, or the web's roots) and names the host.
    VerifyIdentity,
}

impl SslMode {
    /// Reads a mode, in any case, as MySQL's and MariaDB's clients spell
    /// them (`PREFERRED` is not offered: a connection that may silently
    /// stay plain protects nothing; say `DISABLED` or `REQUIRED`).
    pub(crate) fn parse(value: &str) -> Result<Self, String> {
        match value.to_ascii_uppercase().as_str() {
            "DISABLED" => Ok(Self::Disabled),
            "REQUIRED" => Ok(Self::Required),
            "VERIFY_CA" => Ok(Self::VerifyCa),
            "VERIFY_IDENTITY" => Ok(Self::VerifyIdentity),
            "PREFERRED" => Err(
                "ssl-mode=PREFERRED is not supported: a connection that may stay \
                 plain protects nothing; use DISABLED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
                    .into(),
            ),
            other => Err(format!(
                "unknown ssl-mode {other:?} (DISABLED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY)"
            )),
        }
    }
}

/// The TLS a URL asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    pub(crate) mode: SslMode,
    pub(crate) ca: Option<PathBuf>,
}

impl Tls {
    /// The driver's settings, or why they cannot be had.
    #[cfg(feature = "tls")]
    pub(crate) fn ssl_opts(&self) -> Result<Option<mysql_async::SslOpts>, String> {
        use mysql_async::SslOpts;
        let mode = match (self.mode, &self.ca) {
            (SslMode::Required, Some(_)) => SslMode::VerifyCa,
            (mode, _) => mode,
        };
        let roots = || {
            self.ca
                .clone()
                .map(|ca| vec![ca.into()])
                .unwrap_or_default()
        };
        Ok(match mode {
            SslMode::Disabled => None,
            SslMode::Required => Some(
                SslOpts::default()
                    .with_danger_accept_invalid_certs(true)
                    .with_danger_skip_domain_validation(true),
            ),
            SslMode::VerifyCa => {
                if self.ca.is_none() {
                    return Err("ssl-mode=VERIFY_CA needs ssl-ca=PATH, the roots to check the server's certificate against".into());
                }
                Some(
                    SslOpts::default()
                        .with_root_certs(roots())
                        .with_danger_skip_domain_validation(true),
                )
            }
            SslMode::VerifyIdentity => Some(SslOpts::default().with_root_certs(roots())),
        })
    }

    /// Without the `tls` feature only `DISABLED` can be had.
    #[cfg(not(feature = "tls"))]
    pub(crate) fn ssl_opts(&self) -> Result<Option<()>, String> {
        match self.mode {
            SslMode::Disabled => Ok(None),
            _ => Err("ssl-mode other than DISABLED needs idem-mysql's `tls` feature".into()),
        }
    }
}
