//! Store URLs: `redis://`, `rediss://`, `redis+cluster://` and
//! `rediss+cluster://`, with idem's own query parameters taken out.

use std::time::Duration;

use crate::error::ConnectError;

/// What a URL asks for, before connecting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// One server: the URL as the `redis` crate reads it.
    Standalone(String),
    /// A Cluster: one URL per seed node, and the URL of any node as
    /// `prefix` + `host:port` + `suffix` (same scheme, user and options).
    Cluster {
        nodes: Vec<String>,
        prefix: String,
        suffix: String,
    },
}

/// A parsed store URL: the target and idem's own query parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedUrl {
    pub(crate) target: Target,
    pub(crate) namespace: Option<String>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) response_timeout: Option<Duration>,
    /// `tls_ca_file`: a PEM file of root certificates to trust instead of
    /// the platform's.
    pub(crate) tls_ca_file: Option<String>,
    /// `replicas`: how many replicas must acknowledge each write.
    pub(crate) replicas: Option<u32>,
    /// `replica_timeout`: how long a write waits for them.
    pub(crate) replica_timeout: Option<Duration>,
    /// `remember`: how long expired keys are remembered.
    pub(crate) remember: Option<Duration>,
}

/// Parses `redis://`, `rediss://`, `redis+cluster://` and
/// `rediss+cluster://` URLs. idem's own query parameters (`namespace`,
/// `connect_timeout`, `response_timeout`) are taken out; the rest is left
/// for the `redis` crate (user, password, database, `protocol=resp3`).
pub(crate) fn parse_url(url: &str) -> Result<ParsedUrl, ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidUrl {
        url: redact(url),
        reason,
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| invalid("expected a scheme such as redis:// or redis+cluster://".into()))?;
    let (cluster, tls) = match scheme {
        "redis" => (false, false),
        "rediss" => (false, true),
        "redis+cluster" => (true, false),
        "rediss+cluster" => (true, true),
        other => {
            return Err(invalid(format!(
                "unknown scheme {other}:// (use redis://, rediss://, redis+cluster:// or rediss+cluster://)"
            )))
        }
    };
    if tls && !cfg!(feature = "tls") {
        return Err(invalid(
            "TLS (rediss://) needs idem-redis built with its `tls` feature".into(),
        ));
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut parsed = ParsedUrl {
        target: Target::Standalone(String::new()),
        namespace: None,
        connect_timeout: None,
        response_timeout: None,
        tls_ca_file: None,
        replicas: None,
        replica_timeout: None,
        remember: None,
    };
    let mut passed_on = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "namespace" => parsed.namespace = Some(value.to_owned()),
            "connect_timeout" => {
                parsed.connect_timeout = Some(idem::url::parse_duration(value).map_err(invalid)?)
            }
            "response_timeout" => {
                parsed.response_timeout = Some(idem::url::parse_duration(value).map_err(invalid)?)
            }
            "replicas" => {
                parsed.replicas = Some(value.parse().map_err(|_| {
                    invalid(format!("replicas={value} is not a number of replicas"))
                })?)
            }
            "replica_timeout" => {
                parsed.replica_timeout = Some(idem::url::parse_duration(value).map_err(invalid)?)
            }
            "remember" => {
                parsed.remember = Some(
                    idem::url::parse_duration(value)
                        .map_err(|e| invalid(format!("remember: {e}")))?,
                )
            }
            "tls_ca_file" if !tls => {
                return Err(invalid(
                    "tls_ca_file is only for TLS URLs (rediss:// or rediss+cluster://)".into(),
                ))
            }
            "tls_ca_file" => parsed.tls_ca_file = Some(value.to_owned()),
            _ => passed_on.push(pair),
        }
    }
    let query = if passed_on.is_empty() {
        String::new()
    } else {
        format!("?{}", passed_on.join("&"))
    };
    let node_scheme = if tls { "rediss" } else { "redis" };
    if !cluster {
        parsed.target = Target::Standalone(format!("{node_scheme}://{rest}{query}"));
        return Ok(parsed);
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !path.is_empty() && path != "0" {
        return Err(invalid(
            "a Redis Cluster has only database 0; remove the /database part".into(),
        ));
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{node_scheme}://{userinfo}{h}{query}"))
        .collect();
    if nodes.is_empty() {
        return Err(invalid("a cluster URL needs at least one host:port".into()));
    }
    parsed.target = Target::Cluster {
        nodes,
        prefix: format!("{node_scheme}://{userinfo}"),
        suffix: query,
    };
    Ok(parsed)
}

/// The URL with any password replaced, for error messages and logs.
pub(crate) fn redact(url: &str) -> String {
    idem::url::redact(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_urls_keep_what_redis_reads_and_take_idem_parameters() {
        let p = parse_url("redis://app:secret@127.0.0.1:6380/2?namespace=orders&connect_timeout=250ms&protocol=resp3&response_timeout=2s")
            .expect("valid");
        assert_eq!(
            p.target,
            Target::Standalone("redis://app:secret@127.0.0.1:6380/2?protocol=resp3".into())
        );
        assert_eq!(p.namespace.as_deref(), Some("orders"));
        assert_eq!(p.connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(p.response_timeout, Some(Duration::from_secs(2)));
        let p = parse_url("redis://h:1?replicas=2&replica_timeout=300ms").expect("valid");
        assert_eq!(p.target, Target::Standalone("redis://h:1".into()));
        assert_eq!(p.replicas, Some(2));
        assert_eq!(p.replica_timeout, Some(Duration::from_millis(300)));
        let p = parse_url("redis://h:1?remember=30d&protocol=resp3").expect("valid");
        assert_eq!(p.remember, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(
            p.target,
            Target::Standalone("redis://h:1?protocol=resp3".into())
        );
        let bad = parse_url("redis://h:1?remember=soon").expect_err("invalid");
        assert!(bad.to_string().contains("remember"), "{bad}");
    }

    #[test]
    fn cluster_urls_become_one_url_per_seed_node() {
        let p = parse_url("redis+cluster://:pw@127.0.0.1:7000,127.0.0.1:7001/?namespace=x")
            .expect("valid");
        assert_eq!(
            p.target,
            Target::Cluster {
                nodes: vec![
                    "redis://:pw@127.0.0.1:7000".into(),
                    "redis://:pw@127.0.0.1:7001".into()
                ],
                prefix: "redis://:pw@".into(),
                suffix: String::new(),
            }
        );
        assert_eq!(p.namespace.as_deref(), Some("x"));
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, needle) in [
            ("127.0.0.1:6379", "expected a scheme"),
            ("memcached://127.0.0.1", "unknown scheme"),
            ("redis+cluster://h:1/3", "only database 0"),
            ("redis+cluster://", "at least one host"),
            (
                "redis://u:hunter2@h:1/?connect_timeout=soon",
                "not a duration",
            ),
            ("redis://h:1?replicas=all", "not a number of replicas"),
        ] {
            let err = parse_url(url).expect_err(url).to_string();
            assert!(err.contains(needle), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{url}: password leaked in {err}");
        }
    }

    #[test]
    fn redact_masks_passwords_only() {
        assert_eq!(redact("redis://u:pw@h:1/0?x=1"), "redis://u:***@h:1/0?x=1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("redis+cluster://:pw@a:1,b:2"),
            "redis+cluster://:***@a:1,b:2"
        );
    }
}
