//! The binary's DynamoDB store (feature `dynamodb`), opened from its URL
//! against a real DynamoDB-compatible server (moto_server, started for the
//! test on a free loopback port), behind the gateway: each key runs once.

#![cfg(feature = "dynamodb")]

mod common;

use common::{config, post, start_upstream, Gateway};
use idem_cli::store::StoreUrl;
use idem_testkit::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_each_key_once_on_a_dynamodb_table_named_by_its_url() {
    let moto = MotoServer::start_serial().expect(
        "moto_server must be installed (scripts/test installs it into ~/.cache/idem/tools/moto)",
    );
    // The credentials come from the environment, as on AWS.
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    let url: StoreUrl = format!(
        "dynamodb://idem-gateway?endpoint={}&region={REGION}&create=true",
        moto.url()
    )
    .parse()
    .expect("a dynamodb URL");
    assert_eq!(url.to_string(), "dynamodb://idem-gateway");
    let store = url.open().await.expect("open the table");

    let (up, upstream) = start_upstream().await;
    let gateway = Gateway::start(store, config(upstream)).await;
    let charge = format!("{}/charge", gateway.url);
    let first = post(&charge, Some("ddb-1")).await;
    assert_eq!(first.status(), 201);
    let body = first.bytes().await.expect("body");
    let (a, b) = tokio::join!(post(&charge, Some("ddb-1")), post(&charge, Some("ddb-1")));
    for again in [a, b] {
        assert_eq!(again.status(), 201);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.bytes().await.expect("body"), body);
    }
    assert_eq!(up.runs("/charge"), 1);
    gateway.shutdown().await;
}
