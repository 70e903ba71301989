//! The gateway's spans, as a log collector gets them: a keyed request is
//! `idem.http`, its run `idem.run` and the call to the upstream
//! `idem.upstream` inside it; W3C trace context reaches the upstream
//! unchanged. Alone in its binary: a subscriber set for one test thread
//! must not race other tests over the spans' cached interest.

mod common;

use std::collections::HashMap;

use common::{config, sqlite, start_upstream, Gateway};
use idem_testkit::logs::Captured;

async fn seen(request: reqwest::RequestBuilder) -> HashMap<String, String> {
    let response = request.send().await.expect("send");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// One runtime thread, so the subscriber set here sees the gateway's tasks.
#[tokio::test(flavor = "current_thread")]
async fn a_keyed_request_is_traced_through_the_gateway_and_its_trace_context_reaches_the_upstream()
{
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .json()
        .with_span_list(true)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = start_upstream().await;
    let gateway = Gateway::start(sqlite(&dir), config(upstream)).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (i, request) in [
        common::client()
            .post(format!("{}/headers", gateway.url))
            .header("idempotency-key", "traced-1"),
        common::client().get(format!("{}/headers", gateway.url)),
    ]
    .into_iter()
    .enumerate()
    {
        let headers = seen(
            request
                .header("traceparent", traceparent)
                .header("tracestate", "vendor=abc"),
        )
        .await;
        assert_eq!(headers["traceparent"], traceparent, "request {i}");
        assert_eq!(headers["tracestate"], "vendor=abc", "request {i}");
    }
    assert_eq!(up.runs("/headers"), 2);
    gateway.shutdown().await;

    let text = captured.text();
    let closed: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["fields"]["message"] == "close")
        .collect();
    let names = |e: &serde_json::Value| -> Vec<String> {
        e["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(std::iter::once(&e["span"]))
            .map(|s| s["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let upstream_calls: Vec<Vec<String>> = closed
        .iter()
        .filter(|e| e["span"]["name"] == "idem.upstream")
        .map(names)
        .collect();
    assert_eq!(
        upstream_calls,
        [
            vec!["idem.http", "idem.run", "idem.upstream"],
            vec!["idem.upstream"],
        ],
        "the keyed call inside its run and request, the unkeyed one alone: {text}"
    );
    let request = closed
        .iter()
        .find(|e| e["span"]["name"] == "idem.http")
        .expect("the keyed request's span");
    assert_eq!(request["span"]["method"], "POST");
    assert_eq!(request["span"]["path"], "/headers");
    assert_eq!(request["span"]["status"], 200);
    assert_eq!(request["span"]["replayed"], false);
}
