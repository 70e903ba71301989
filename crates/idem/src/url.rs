//! Helpers for stores configured by URL: one way to mask a password, one
//! way to read a duration and one to decode a path given as a parameter,
//! so every store's URLs behave alike.

use std::time::Duration;

/// `url` with any password replaced by `***` (or, for a bare user info
/// with no colon, the whole user info), for error messages and logs.
///
/// ```
/// assert_eq!(
///     idem::url::redact("postgres://app:s3cret@db:5432/orders"),
///     "postgres://app:***@db:5432/orders"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            format!("{scheme}://{masked}@{hosts}{}", &rest[authority_end..])
        }
        None => url.to_owned(),
    }
}

/// Parses `250ms`, `2s`, `15m`, `24h`, `30d` or a bare number of
/// milliseconds; the error says how to write one.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(idem::url::parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(idem::url::parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
/// assert!(idem::url::parse_duration("soon").is_err());
/// ```
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let bad = || format!("{value:?} is not a duration (write 500ms, 2s, 15m, 24h or 30d)");
    let units: [(&str, u64); 5] = [
        ("ms", 1),
        ("s", 1000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ];
    let (digits, scale) = units
        .iter()
        .find_map(|(unit, scale)| Some((value.strip_suffix(unit)?, *scale)))
        .unwrap_or((value, 1));
    let n: u64 = digits.parse().map_err(|_| bad())?;
    Ok(Duration::from_millis(n.saturating_mul(scale)))
}

/// `%XX` escapes decoded (a path given as a URL parameter); anything that
/// is not a valid escape is kept as it is.
///
/// ```
/// assert_eq!(idem::url::percent_decode("/etc/my%20ca.pem"), "/etc/my ca.pem");
/// assert_eq!(idem::url::percent_decode("100%"), "100%");
/// ```
pub fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_and_the_rest_kept() {
        assert_eq!(redact("redis://:pw@h:1/0?x=1"), "redis://:***@h:1/0?x=1");
        assert_eq!(redact("redis://user@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn durations_take_a_unit_or_bare_milliseconds() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3h"), Ok(Duration::from_secs(3 * 3600)));
        assert_eq!(parse_duration("40"), Ok(Duration::from_millis(40)));
        assert!(parse_duration("2w").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("").is_err());
    }
}
