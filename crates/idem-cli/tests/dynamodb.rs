//! The binary's DynamoDB store (feature `dynamodb`), opened from its URL
//! against a real DynamoDB-compatible server (moto_server, started for the
//! test on a free loopback port), behind the gateway: each key runs once,
//! and a retry after the retention is 410 by default, before and after an
//! `idem purge` run by another process.

#![cfg(feature = "dynamodb")]

mod common;

use common::process::{late_retry, purge};
use common::{config, post, problem, start_upstream, Gateway};
use idem_cli::store::StoreUrl;
use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};

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

/// A result the store refuses (over DynamoDB's 400 KB item limit even
/// compressed, within
/// idem serve's own 1 MiB request limit) ends the claim as a terminal
/// failure with the reason: the answer is final, and the next claim gets
/// the failure instead of the work to run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_serve_ends_a_claim_whose_result_the_store_refused() {
    use idem_cli::serve::{self, Tenants};
    use serde_json::{json, Value};

    const TOKEN: &str = "shop-token-0123456789abcdef";
    let moto = MotoServer::start_serial().expect("moto_server");
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    let url: StoreUrl = format!(
        "dynamodb://idem-serve-refusal?endpoint={}&region={REGION}&create=true",
        moto.url()
    )
    .parse()
    .expect("a dynamodb URL");
    let store = url.open().await.expect("open the table");
    let tokens = vec![TOKEN.to_owned()];
    let config =
        common::serve_config(Tenants::new([("shop", tokens.as_slice())]).expect("tenants"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(serve::serve(store, config, listener, async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let request = client
            .post(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .json(&body);
        async move {
            let response = request.send().await.expect("send");
            let status = response.status().as_u16();
            let text = response.text().await.expect("body");
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        }
    };
    let claim = json!({ "scope": "exports", "key": "big-1" });
    let (status, claimed) = post("/v1/claim", claim.clone()).await;
    assert_eq!(status, 200, "{claimed}");
    assert_eq!(claimed["outcome"], "acquired", "{claimed}");

    // Random letters: zstd (which the store applies) cannot pack them
    // under the limit.
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let big: String = (0..900 * 1024)
        .map(|_| char::from(LETTERS[usize::from(rand::random::<u8>()) % LETTERS.len()]))
        .collect();
    let (status, refused) = post(
        "/v1/complete",
        json!({ "lease": claimed["lease"], "response": big }),
    )
    .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("/response-not-stored")),
        "{refused}"
    );
    let (status, again) = post("/v1/claim", claim).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["outcome"], "failed", "not run again: {again}");
    assert_eq!(again["class"], "terminal", "{again}");
    assert!(
        again["message"]
            .as_str()
            .is_some_and(|m| m.contains("refused its response")),
        "{again}"
    );
    let _ = stop.send(());
    served.await.expect("join").expect("served cleanly");
}

/// The gateway remembers expired keys on DynamoDB without being told: a
/// late retry is 410 `key-expired` while the expired item is held and
/// after another process's `idem purge` stripped it to its memory, and
/// never reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_is_410_on_dynamodb_by_default() {
    let moto = MotoServer::start_serial().expect("moto_server");
    std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    let store = format!(
        "dynamodb://idem-late?endpoint={}&region={REGION}&create=true",
        moto.url()
    );
    let (up, _gw, url, late) = late_retry(&store, &[]).await;
    problem(late, 410, "key-expired").await;

    let purged = purge(&store);
    assert!(
        purged.contains("\"purged\":1"),
        "the expired item was stripped: {purged}"
    );
    problem(post(&url, Some("order-1")).await, 410, "key-expired").await;
    assert_eq!(
        up.runs("/charge"),
        1,
        "late retries never reach the upstream"
    );
}
