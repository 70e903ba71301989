//! `postgres://` URLs: idem's own parameters taken out, the rest for
//! tokio-postgres.

use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::config::SslMode;

use super::ssl_mode::{RootCert, Tls, TlsMode};
use crate::error::ConnectError;

/// What a URL says, once idem's own parameters are taken out.
#[derive(Debug)]
pub(crate) struct ParsedUrl {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) schema: Option<String>,
    pub(crate) pool_size: Option<usize>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) response_timeout: Option<Duration>,
    pub(crate) listen: Option<bool>,
    pub(crate) remember: Option<Duration>,
    pub(crate) tls: Tls,
}

/// Parses `postgres://` / `postgresql://` URLs. idem reads `schema`,
/// `pool_size`, `connect_timeout`, `response_timeout` (`500ms`, `2s`),
/// `remember` (`30d`: how long expired keys are remembered),
/// `listen` (`true`, `false`), `sslmode` and `sslrootcert`; every other parameter (`application_name`,
/// `options`, …) goes to tokio-postgres, which rejects the ones it does
/// not know.
pub(crate) fn parse_url(url: &str) -> Result<ParsedUrl, ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidUrl {
        url: idem::url::redact(url),
        reason,
    };
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(invalid(
            "expected postgres://[user[:password]@]host[:port]/database".into(),
        ));
    };
    if scheme != "postgres" && scheme != "postgresql" {
        return Err(invalid(format!(
            "unknown scheme {scheme}:// (use postgres:// or postgresql://)"
        )));
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut parsed = ParsedUrl {
        config: tokio_postgres::Config::new(),
        schema: None,
        pool_size: None,
        connect_timeout: None,
        response_timeout: None,
        listen: None,
        remember: None,
        tls: Tls {
            mode: TlsMode::Prefer,
            root_cert: None,
        },
    };
    let mut passed_on = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "schema" => parsed.schema = Some(value.to_owned()),
            "pool_size" => {
                let n: usize = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    invalid(format!("pool_size={value:?} is not a positive number"))
                })?;
                parsed.pool_size = Some(n);
            }
            "connect_timeout" => {
                parsed.connect_timeout = Some(idem::url::parse_duration(value).map_err(invalid)?);
            }
            "response_timeout" => {
                parsed.response_timeout = Some(idem::url::parse_duration(value).map_err(invalid)?);
            }
            "remember" => {
                parsed.remember = Some(idem::url::parse_duration(value).map_err(invalid)?);
            }
            "listen" => {
                parsed.listen = Some(match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(invalid(format!("listen={value:?} is not true or false"))),
                });
            }
            "sslmode" => {
                parsed.tls.mode = TlsMode::parse(value).ok_or_else(|| {
                    invalid(format!(
                        "sslmode={value:?} is not one of disable, prefer, require, verify-ca, verify-full"
                    ))
                })?;
            }
            "sslrootcert" if value == "system" => parsed.tls.root_cert = Some(RootCert::System),
            "sslrootcert" if !value.is_empty() => {
                parsed.tls.root_cert = Some(RootCert::File(PathBuf::from(
                    idem::url::percent_decode(value),
                )));
            }
            _ => passed_on.push(pair),
        }
    }
    // As libpq: the platform's many public roots prove nothing about which
    // server this is unless the name is checked too.
    match (parsed.tls.mode, &parsed.tls.root_cert) {
        (TlsMode::VerifyCa, None | Some(RootCert::System)) => {
            return Err(invalid(
                "sslmode=verify-ca needs sslrootcert=PATH (a CA file): against the platform's \
                 public roots any public certificate passes; use verify-full for those"
                    .into(),
            ))
        }
        (TlsMode::Disable | TlsMode::Prefer | TlsMode::Require, Some(RootCert::System)) => {
            return Err(invalid(
                "sslrootcert=system needs sslmode=verify-full".into(),
            ))
        }
        _ => {}
    }
    if !cfg!(feature = "tls") {
        let needs_tls = parsed.tls.root_cert.is_some()
            || !matches!(parsed.tls.mode, TlsMode::Disable | TlsMode::Prefer);
        if needs_tls {
            return Err(invalid(
                "sslmode=require/verify-ca/verify-full and sslrootcert need TLS: \
                 build idem-postgres with its `tls` feature"
                    .into(),
            ));
        }
    }
    let rebuilt = if passed_on.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", passed_on.join("&"))
    };
    parsed.config = rebuilt
        .parse()
        .map_err(|e: tokio_postgres::Error| invalid(e.to_string()))?;
    parsed.config.ssl_mode(match parsed.tls.mode {
        TlsMode::Disable => SslMode::Disable,
        TlsMode::Prefer => SslMode::Prefer,
        TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => SslMode::Require,
    });
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idem_parameters_are_taken_out_and_the_rest_passed_on() {
        let p = parse_url(
            "postgres://app:pw@127.0.0.1:6543/orders?schema=idem&pool_size=8&connect_timeout=250ms&application_name=svc&response_timeout=3s&listen=false",
        )
        .expect("valid");
        assert_eq!(p.schema.as_deref(), Some("idem"));
        assert_eq!(p.pool_size, Some(8));
        assert_eq!(p.connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(p.response_timeout, Some(Duration::from_secs(3)));
        assert_eq!(p.listen, Some(false));
        assert_eq!(p.config.get_dbname(), Some("orders"));
        assert_eq!(p.config.get_user(), Some("app"));
        assert_eq!(p.config.get_application_name(), Some("svc"));
        assert_eq!(p.tls.mode, TlsMode::Prefer, "libpq's default");
    }

    #[test]
    fn ssl_parameters_are_read_by_idem() {
        let p = parse_url("postgres://h/db?sslmode=disable").expect("valid");
        assert_eq!(p.tls.mode, TlsMode::Disable);
        assert_eq!(p.config.get_ssl_mode(), SslMode::Disable);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn verify_modes_and_root_certificates_are_read() {
        let url = "postgres://h/db?sslmode=verify-full&sslrootcert=/etc/ca%20dir/root.crt";
        let p = parse_url(url).expect("valid");
        assert_eq!(p.tls.mode, TlsMode::VerifyFull);
        assert_eq!(p.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(
            p.tls.root_cert,
            Some(RootCert::File("/etc/ca dir/root.crt".into()))
        );
        let p = parse_url("postgres://h/db?sslmode=verify-full&sslrootcert=system").expect("valid");
        assert_eq!(p.tls.root_cert, Some(RootCert::System));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn verify_modes_need_the_tls_feature() {
        for url in [
            "postgres://h/db?sslmode=require",
            "postgres://h/db?sslmode=verify-full",
            "postgres://h/db?sslrootcert=/ca.crt",
        ] {
            let err = parse_url(url).expect_err(url).to_string();
            assert!(err.contains("`tls` feature"), "{url}: {err}");
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, needle) in [
            ("mysql://root:pw@h/db", "unknown scheme"),
            ("postgres://u:pw@h/db?pool_size=0", "pool_size"),
            (
                "postgres://u:pw@h/db?connect_timeout=soon",
                "not a duration",
            ),
            ("postgres://u:pw@h/db?sslmode=allow", "not one of"),
            ("postgres://u:pw@h/db?listen=no", "not true or false"),
            (
                "postgres://u:pw@h/db?sslmode=verify-ca",
                "needs sslrootcert",
            ),
            (
                "postgres://u:pw@h/db?sslmode=verify-ca&sslrootcert=system",
                "needs sslrootcert",
            ),
            (
                "postgres://u:pw@h/db?sslmode=require&sslrootcert=system",
                "needs sslmode=verify-full",
            ),
            ("postgres://u:pw@h/db?no_such_option=1", "no_such_option"),
            ("127.0.0.1:5432", "expected postgres://"),
        ] {
            let err = parse_url(url).expect_err(url).to_string();
            assert!(err.contains(needle), "{url}: {err}");
            assert!(!err.contains("pw@"), "{url}: {err}");
        }
    }
}
