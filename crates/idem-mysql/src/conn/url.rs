//! `mysql://` URLs: idem's own parameters taken out, the rest for the
//! driver.

use std::path::PathBuf;
use std::time::Duration;

use mysql_async::Opts;

use super::tls::{SslMode, Tls};
use crate::error::ConnectError;

/// What a URL says, once idem's own parameters are taken out.
#[derive(Debug)]
pub(crate) struct ParsedUrl {
    pub(crate) opts: Opts,
    pub(crate) database: String,
    pub(crate) pool_size: Option<usize>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) response_timeout: Option<Duration>,
    pub(crate) prefer_socket: bool,
    pub(crate) tls: Tls,
    /// `remember`: how long expired keys are remembered ([`idem::horizon`]).
    pub(crate) remember: Option<Duration>,
}

/// Parses `mysql://` and `mariadb://` URLs. idem reads `pool_size`,
/// `connect_timeout`, `response_timeout` (`500ms`, `2s`), `remember`
/// (`30d`: how long expired keys are remembered), `ssl-mode`
/// and `ssl-ca`; every other parameter goes to mysql_async, which rejects
/// the ones it does not know. The database is required: idem's tables
/// live there.
pub(crate) fn parse_url(url: &str) -> Result<ParsedUrl, ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidUrl {
        url: idem::url::redact(url),
        reason,
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(
            "expected mysql://[user[:password]@]host[:port]/database".into(),
        ));
    };
    if scheme != "mysql" && scheme != "mariadb" {
        return Err(invalid(format!(
            "unknown scheme {scheme}:// (use mysql:// or mariadb://)"
        )));
    }
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut parsed = ParsedUrl {
        opts: Opts::default(),
        database: String::new(),
        pool_size: None,
        connect_timeout: None,
        response_timeout: None,
        prefer_socket: false,
        remember: None,
        tls: Tls {
            mode: SslMode::Disabled,
            ca: None,
        },
    };
    let duration = |name: &str, value: &str| {
        idem::url::parse_duration(value).map_err(|e| invalid(format!("{name}: {e}")))
    };
    let mut passed_on = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "pool_size" => {
                parsed.pool_size = Some(
                    value
                        .parse()
                        .ok()
                        .filter(|&n: &usize| n > 0)
                        .ok_or_else(|| invalid(format!("pool_size={value}: expected 1 or more")))?,
                );
            }
            "connect_timeout" => parsed.connect_timeout = Some(duration(name, value)?),
            "response_timeout" => parsed.response_timeout = Some(duration(name, value)?),
            "remember" => parsed.remember = Some(duration(name, value)?),
            "ssl-mode" | "ssl_mode" | "sslmode" => {
                parsed.tls.mode = SslMode::parse(value).map_err(invalid)?;
            }
            "ssl-ca" | "ssl_ca" => {
                parsed.tls.ca = Some(PathBuf::from(idem::url::percent_decode(value)))
            }
            "prefer_socket" => {
                parsed.prefer_socket = value == "true";
                passed_on.push(pair);
            }
            "require_ssl" | "verify_ca" | "verify_identity" | "built_in_roots" => {
                return Err(invalid(format!(
                    "{name}: say ssl-mode=REQUIRED|VERIFY_CA|VERIFY_IDENTITY (and ssl-ca=PATH) instead"
                )));
            }
            _ => passed_on.push(pair),
        }
    }
    parsed.tls.ssl_opts().map_err(invalid)?;
    let driver_url = if passed_on.is_empty() {
        format!("mysql://{base}")
    } else {
        format!("mysql://{base}?{}", passed_on.join("&"))
    };
    parsed.opts = Opts::from_url(&driver_url).map_err(|e| invalid(e.to_string()))?;
    parsed.database = parsed
        .opts
        .db_name()
        .filter(|db| !db.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| invalid("no database: add /DATABASE to the URL".into()))?;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idem_parameters_are_taken_out_and_the_rest_passed_on() {
        let parsed = parse_url(
            "mysql://app:secret@127.0.0.1:3307/orders?pool_size=4&response_timeout=2s&stmt_cache_size=64&remember=30d",
        )
        .expect("valid");
        assert_eq!(parsed.database, "orders");
        assert_eq!(parsed.pool_size, Some(4));
        assert_eq!(parsed.response_timeout, Some(Duration::from_secs(2)));
        assert_eq!(parsed.remember, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(parsed.opts.stmt_cache_size(), 64);
        assert_eq!(parsed.opts.tcp_port(), 3307);
        assert!(!parsed.prefer_socket);
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("postgres://a@h/db", "unknown scheme"),
            ("mysql://app:secret@h", "no database"),
            ("mysql://app:secret@h/db?pool_size=0", "pool_size"),
            (
                "mysql://app:secret@h/db?response_timeout=soon",
                "response_timeout",
            ),
            ("mysql://app:secret@h/db?remember=soon", "remember"),
            ("mysql://app:secret@h/db?ssl-mode=PREFERRED", "PREFERRED"),
            ("mysql://app:secret@h/db?require_ssl=true", "ssl-mode"),
            ("mysql://app:secret@h/db?no_such=1", "no_such"),
        ] {
            let error = parse_url(url).expect_err(url).to_string();
            assert!(error.contains(says), "{url}: {error}");
            assert!(!error.contains("secret"), "{url}: {error}");
        }
    }
}
