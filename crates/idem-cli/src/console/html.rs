//! The console's HTML: one layout, escaping, and the pieces pages share
//! (tables, forms with the form token, charts drawn as SVG on the server).
//! No script runs in the pages and nothing is fetched from elsewhere.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::history::Point;

/// `text` safe to place in HTML text or a quoted attribute.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one part of a URL's query.
pub(crate) fn query(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A time in milliseconds since the epoch, in UTC.
pub(crate) fn time(ms: Option<u64>) -> String {
    /// The end of year 9999, the last an HTTP date can name.
    const LAST_MS: u64 = 253_402_300_799_999;
    match ms {
        None => "—".to_owned(),
        Some(ms) if ms > LAST_MS => format!("{ms} ms after the epoch"),
        Some(ms) => httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(ms)),
    }
}

const STYLE: &str = "\
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}\
header{background:#1d232a;color:#fff;padding:10px 24px;display:flex;gap:20px;align-items:center}\
header a{color:#cfe3ff;text-decoration:none}header strong{margin-right:12px}\
main{padding:16px 24px;max-width:1200px}\
table{border-collapse:collapse;background:#fff;margin:8px 0 16px}\
th,td{border:1px solid #dde1e6;padding:4px 8px;text-align:left;vertical-align:top}\
th{background:#eef1f4}code,pre{font:12px ui-monospace,monospace}\
pre{background:#fff;border:1px solid #dde1e6;padding:8px;overflow:auto}\
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:12px}\
figure{margin:0;background:#fff;border:1px solid #dde1e6;padding:8px}\
figcaption{font-weight:600}.note{color:#5a6570}.error{color:#a3001b}\
form.inline{display:inline}button{cursor:pointer}\
.state-in_progress{color:#8a5a00}.state-completed{color:#13652c}\
.state-failed{color:#a3001b}.state-released{color:#5a6570}";

/// A whole page: the title, the console's links, and `body`.
pub(crate) fn page(title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content='width=device-width'>\
         <title>{title} · idem console</title><style>{STYLE}</style></head><body>\
         <header><strong>idem console</strong><a href='/console'>Overview</a>\
         <a href='/console/records'>Records</a><a href='/console/records?state=parked'>Parked</a>\
         <a href='/console/failures'>Failures</a>\
         <form class=inline method=post action='/console/logout'><button>Sign out</button></form>\
         </header><main><h1>{title}</h1>{body}</main></body></html>",
        title = escape(title)
    );
    html_response(StatusCode::OK, html)
}

/// An HTML answer with the headers every console page carries: not
/// cached, not framed by another page, no script, no outside fetch.
pub(crate) fn html_response(status: StatusCode, html: String) -> Response {
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
             form-action 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// A page saying what went wrong, with `status`.
pub(crate) fn problem(status: StatusCode, message: &str) -> Response {
    let body = format!("<p class=error id=problem>{}</p>", escape(message));
    let mut response = page(status.canonical_reason().unwrap_or("Error"), &body);
    *response.status_mut() = status;
    response
}

/// A form that POSTs `fields` (name, value) and the form token to
/// `action`, with one button.
pub(crate) fn form(
    action: &str,
    form_token: &str,
    fields: &[(&str, &str)],
    button: &str,
) -> String {
    let mut out = format!(
        "<form class=inline method=post action='{}'>",
        escape(action)
    );
    for (name, value) in fields {
        let _ = write!(
            out,
            "<input type=hidden name='{}' value='{}'>",
            escape(name),
            escape(value)
        );
    }
    let _ = write!(
        out,
        "<input type=hidden name=form_token value='{}'><button>{}</button></form>",
        escape(form_token),
        escape(button)
    );
    out
}

/// A chart: its id, its title, and the figure it draws from a sample.
pub(crate) type Chart = (&'static str, &'static str, fn(&Point) -> f64);

/// The overview's charts.
pub(crate) const CHARTS: [Chart; 5] = [
    ("executions", "Executions", |p| p.executions),
    ("replays", "Replays", |p| p.replays),
    ("duplicate_rate", "Duplicate rate (%)", |p| {
        p.duplicate_rate * 100.0
    }),
    ("waits", "Waits (claims of a key in progress)", |p| p.waits),
    ("store_ms", "Store latency (mean ms)", |p| p.store_ms),
];

/// One chart: a line of `value` over `points`, drawn as SVG, with the
/// figures in `data-points` (time in ms, value) for anyone reading the page.
pub(crate) fn chart(id: &str, title: &str, points: &[Point], value: fn(&Point) -> f64) -> String {
    const W: f64 = 320.0;
    const H: f64 = 120.0;
    let values: Vec<(u64, f64)> = points.iter().map(|p| (p.at_ms, value(p))).collect();
    let top = values.iter().map(|(_, v)| *v).fold(0.0_f64, f64::max);
    let last = values.last().map_or(0.0, |(_, v)| *v);
    let data = serde_json::to_string(&values).unwrap_or_else(|_| "[]".to_owned());
    let step = if values.len() > 1 {
        W / (values.len() - 1) as f64
    } else {
        0.0
    };
    let line: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, (_, v))| {
            let y = if top > 0.0 {
                H - v / top * (H - 8.0)
            } else {
                H
            };
            format!("{:.1},{:.1}", i as f64 * step, y)
        })
        .collect();
    format!(
        "<figure class=chart id='chart-{id}' data-points='{data}'>\
         <figcaption>{title}</figcaption>\
         <svg width='{W}' height='{H}' viewBox='0 0 {W} {H}' role=img aria-label='{title}'>\
         <rect width='{W}' height='{H}' fill='#f9fafb'/>\
         <polyline fill=none stroke='#2563eb' stroke-width=2 points='{line}'/></svg>\
         <div class=note>last {last:.2} · peak {top:.2}</div></figure>",
        title = escape(title),
        data = escape(&data),
        line = line.join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_past_what_a_date_can_name_is_shown_as_a_number() {
        assert_eq!(time(Some(0)), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            time(Some(u64::MAX)),
            format!("{} ms after the epoch", u64::MAX)
        );
        assert_eq!(time(None), "—");
    }

    #[test]
    fn markup_in_keys_and_messages_stays_text() {
        assert_eq!(
            escape("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        assert_eq!(query("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn a_chart_carries_its_figures() {
        let point = |at_ms, executions| Point {
            at_ms,
            executions,
            replays: 0.0,
            duplicate_rate: 0.0,
            waits: 0.0,
            store_ms: 0.0,
        };
        let html = chart(
            "executions",
            "Executions",
            &[point(1, 2.0), point(2, 5.0)],
            |p| p.executions,
        );
        assert!(html.contains("data-points='[[1,2.0],[2,5.0]]'"), "{html}");
        assert!(html.contains("points='0.0,75.2 320.0,8.0'"), "{html}");
    }
}
