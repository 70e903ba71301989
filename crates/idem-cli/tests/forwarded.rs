//! The gateway tells the upstream who asked, over what and for which host,
//! as reverse proxies do, and does not let a client forge it.

mod common;

use std::collections::HashMap;

use common::{config, sqlite, start_upstream, Gateway};
use idem_cli::forwarded::ForwardedPolicy;

async fn seen(request: reqwest::RequestBuilder) -> HashMap<String, String> {
    let response = request.send().await.expect("send");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

#[tokio::test]
async fn the_upstream_learns_the_client_and_a_forged_chain_is_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = start_upstream().await;
    let gateway = Gateway::start(sqlite(&dir), config(upstream)).await;
    let host = gateway.url.trim_start_matches("http://").to_owned();
    let client = common::client();
    for request in [
        client
            .post(format!("{}/headers", gateway.url))
            .header("idempotency-key", "\"fwd-1\""),
        client.get(format!("{}/headers", gateway.url)),
    ] {
        let headers = seen(
            request
                .header("x-forwarded-for", "6.6.6.6")
                .header("forwarded", "for=6.6.6.6;proto=https")
                .header("x-forwarded-proto", "https"),
        )
        .await;
        assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(headers["x-forwarded-host"], host);
        assert_eq!(
            headers["forwarded"],
            format!("for=127.0.0.1;host=\"{host}\";proto=http")
        );
        assert_eq!(headers["host"], host, "the client's Host is kept");
    }
    assert_eq!(up.runs("/headers"), 2);
    gateway.shutdown().await;
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_chain_grows_and_host_can_be_the_upstreams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_up, upstream) = start_upstream().await;
    let mut config = config(upstream);
    config.forwarded = ForwardedPolicy {
        trust_incoming: true,
        preserve_host: false,
    };
    let gateway = Gateway::start(sqlite(&dir), config).await;
    let host = gateway.url.trim_start_matches("http://").to_owned();
    let headers = seen(
        common::client()
            .post(format!("{}/headers", gateway.url))
            .header("idempotency-key", "\"fwd-2\"")
            .header("x-forwarded-for", "198.51.100.1")
            .header("forwarded", "for=198.51.100.1;proto=https")
            .header("x-forwarded-proto", "https"),
    )
    .await;
    assert_eq!(headers["x-forwarded-for"], "198.51.100.1, 127.0.0.1");
    assert_eq!(headers["x-forwarded-proto"], "https");
    assert_eq!(
        headers["forwarded"],
        format!("for=198.51.100.1;proto=https, for=127.0.0.1;host=\"{host}\";proto=http")
    );
    assert_eq!(headers["host"], upstream.to_string());
    gateway.shutdown().await;
}
