//! `idem serve` on a real listener over a real store (the embedded SQLite
//! file), called over HTTP: the claim lifecycle, fencing and takeovers,
//! writes sent again after a lost answer, tenant isolation, the step
//! journal, bounded waits, real concurrency, and bad input.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use idem_cli::serve::{self, ServeConfig, Tenants};
use idem_cli::store::AnyStore;
use idem_sqlite::SqliteStore;
use reqwest::StatusCode;
use serde_json::{json, Value};

const SHOP: &str = "shop-token-0123456789abcdef";
const BILLING: &str = "billing-token-0123456789abcdef";

struct Server {
    addr: SocketAddr,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start() -> Self {
        Self::with(|_| {}).await
    }

    async fn with(change: impl FnOnce(&mut ServeConfig)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = AnyStore::Sqlite(SqliteStore::open(dir.path().join("idem.db")).expect("open"));
        let shop = vec![SHOP.to_owned()];
        let billing = vec![BILLING.to_owned()];
        let mut config = ServeConfig {
            max_request_bytes: 64 * 1024,
            ..common::serve_config(
                Tenants::new([("shop", shop.as_slice()), ("billing", billing.as_slice())])
                    .expect("tenants"),
            )
        };
        change(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve::serve(store, config, listener, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            client: reqwest::Client::new(),
            _dir: dir,
            stop: Some(stop),
            task,
        }
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(
            self.client
                .post(format!("http://{}{path}", self.addr))
                .bearer_auth(token)
                .json(&body),
        )
        .await
    }

    async fn get(&self, token: &str, path: &str, scope: &str, key: &str) -> (StatusCode, Value) {
        self.send(
            self.client
                .get(format!("http://{}{path}", self.addr))
                .query(&[("scope", scope), ("key", key)])
                .bearer_auth(token),
        )
        .await
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let response = request.send().await.expect("send");
        let status = response.status();
        let text = response.text().await.expect("body");
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
        };
        (status, value)
    }

    async fn claim(&self, token: &str, scope: &str, key: &str, extra: Value) -> Value {
        let mut body = json!({ "scope": scope, "key": key });
        if let Value::Object(extra) = extra {
            body.as_object_mut().expect("object").extend(extra);
        }
        let (status, answer) = self.post(token, "/v1/claim", body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .expect("join")
            .expect("served cleanly");
    }
}

fn problem_type(answer: &Value) -> &str {
    answer["type"]
        .as_str()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or("")
}

#[tokio::test]
async fn a_run_is_claimed_completed_and_replayed_byte_for_byte() {
    let server = Server::start().await;
    let first = server.claim(SHOP, "charges", "order-1", json!({})).await;
    assert_eq!(first["outcome"], "acquired", "{first}");
    assert_eq!(first["takeover"], false);
    assert_eq!(first["lease"]["attempt"], 1);
    let duplicate = server.claim(SHOP, "charges", "order-1", json!({})).await;
    assert_eq!(duplicate["outcome"], "in_progress", "{duplicate}");
    assert!(duplicate["retry_after_ms"].as_u64().unwrap_or(0) > 0);

    // The response is stored as sent: key order and number forms kept.
    let raw = r#"{"id":"ch_1","amount":1.50,"z":[],"a":null}"#;
    let lease = first["lease"].clone();
    let body = format!(r#"{{"lease":{lease},"response":{raw}}}"#);
    let response = server
        .client
        .post(format!("http://{}/v1/complete", server.addr))
        .bearer_auth(SHOP)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("complete");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    let replay = server
        .client
        .post(format!("http://{}/v1/claim", server.addr))
        .bearer_auth(SHOP)
        .json(&json!({ "scope": "charges", "key": "order-1" }))
        .send()
        .await
        .expect("claim")
        .text()
        .await
        .expect("text");
    assert_eq!(
        replay,
        format!(r#"{{"outcome":"completed","response":{raw}}}"#)
    );

    let (status, record) = server.get(SHOP, "/v1/record", "charges", "order-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(record["state"], "completed");
    assert_eq!(record["scope"], "charges");
    assert_eq!(record["fence"], lease["fence"]);
    server.stop().await;
}

#[tokio::test]
async fn a_takeover_fences_out_the_old_holder_and_a_resent_write_is_done_once() {
    let server = Server::start().await;
    let old = server
        .claim(
            SHOP,
            "jobs",
            "k",
            json!({ "lease_ms": 100.0, "wait_ms": null }),
        )
        .await;
    assert_eq!(old["outcome"], "acquired");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let new = server.claim(SHOP, "jobs", "k", json!({})).await;
    assert_eq!(new["outcome"], "acquired", "{new}");
    assert_eq!(new["takeover"], true);
    assert_eq!(new["lease"]["attempt"], 2);
    assert!(new["lease"]["fence"].as_u64() > old["lease"]["fence"].as_u64());

    // The old holder can neither extend nor complete: nothing is written.
    for (path, body) in [
        (
            "/v1/extend",
            json!({ "lease": old["lease"], "lease_ms": 1000 }),
        ),
        (
            "/v1/complete",
            json!({ "lease": old["lease"], "response": "stale" }),
        ),
        ("/v1/release", json!({ "lease": old["lease"] })),
    ] {
        let (status, answer) = server.post(SHOP, path, body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {answer}");
        assert_eq!(problem_type(&answer), "lease-lost");
    }
    let complete = json!({ "lease": new["lease"], "response": {"by": "new"} });
    let (status, _) = server.post(SHOP, "/v1/complete", complete.clone()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // Sent again, as a client does after a lost answer: done, not lost.
    let (status, answer) = server.post(SHOP, "/v1/complete", complete).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{answer}");
    // Another response under the same lease is not the same write.
    let (status, _) = server
        .post(
            SHOP,
            "/v1/complete",
            json!({ "lease": new["lease"], "response": {"by": "other"} }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let replay = server.claim(SHOP, "jobs", "k", json!({})).await;
    assert_eq!(replay["response"], json!({"by": "new"}));
    server.stop().await;
}

#[tokio::test]
async fn failures_release_or_stay_by_class_and_fingerprints_bind_the_key() {
    let server = Server::start().await;
    let first = server
        .claim(SHOP, "mail", "m1", json!({ "fingerprint": "body-a" }))
        .await;
    let fail = json!({ "lease": first["lease"], "class": "retryable", "message": "smtp down" });
    let (status, _) = server.post(SHOP, "/v1/fail", fail.clone()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = server.post(SHOP, "/v1/fail", fail).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "a resent failure is done");

    let mismatch = server
        .claim(SHOP, "mail", "m1", json!({ "fingerprint": "body-b" }))
        .await;
    assert_eq!(mismatch["outcome"], "mismatch");
    let second = server
        .claim(SHOP, "mail", "m1", json!({ "fingerprint": "body-a" }))
        .await;
    assert_eq!(second["outcome"], "acquired");
    assert_eq!(second["lease"]["attempt"], 2);
    let (status, _) = server
        .post(
            SHOP,
            "/v1/fail",
            json!({ "lease": second["lease"], "class": "terminal", "message": "no such mailbox" }),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let replay = server
        .claim(SHOP, "mail", "m1", json!({ "fingerprint": "body-a" }))
        .await;
    assert_eq!(
        replay,
        json!({ "outcome": "failed", "class": "terminal", "message": "no such mailbox" })
    );
    server.stop().await;
}

#[tokio::test]
async fn no_token_can_see_or_touch_another_tenants_records() {
    let server = Server::start().await;
    let shop = server.claim(SHOP, "orders", "o-1", json!({})).await;
    assert_eq!(shop["outcome"], "acquired");

    let (status, answer) = server.get(BILLING, "/v1/record", "orders", "o-1").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    for (path, body) in [
        (
            "/v1/complete",
            json!({ "lease": shop["lease"], "response": "billing wrote this" }),
        ),
        (
            "/v1/extend",
            json!({ "lease": shop["lease"], "lease_ms": 1000 }),
        ),
        ("/v1/release", json!({ "lease": shop["lease"] })),
        (
            "/v1/steps/begin",
            json!({ "lease": shop["lease"], "step": "s" }),
        ),
    ] {
        let (status, answer) = server.post(BILLING, path, body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {answer}");
    }
    // The same scope and key are another record for billing.
    let billing = server.claim(BILLING, "orders", "o-1", json!({})).await;
    assert_eq!(billing["outcome"], "acquired");
    let (status, _) = server
        .post(
            SHOP,
            "/v1/complete",
            json!({ "lease": shop["lease"], "response": "shop" }),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, record) = server.get(SHOP, "/v1/record", "orders", "o-1").await;
    assert_eq!(record["response"], "shop");
    let (_, record) = server.get(BILLING, "/v1/record", "orders", "o-1").await;
    assert_eq!(record["state"], "in_progress");

    for token in ["", "Bearer", "not-a-token-of-anyone-at-all"] {
        let (status, answer) = server.post(token, "/v1/claim", json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}: {answer}");
        assert_eq!(problem_type(&answer), "unauthorized");
    }
    let refused = server
        .client
        .post(format!("http://{}/v1/claim", server.addr))
        .send()
        .await
        .expect("send");
    assert_eq!(
        refused.headers()["www-authenticate"],
        "Bearer realm=\"idem\""
    );
    server.stop().await;
}

#[tokio::test]
async fn steps_are_journaled_resumed_and_found_in_doubt_after_a_takeover() {
    let server = Server::start().await;
    let first = server
        .claim(SHOP, "ship", "s-1", json!({ "lease_ms": 150 }))
        .await;
    let begin = json!({ "lease": first["lease"], "step": "label" });
    let (status, fresh) = server.post(SHOP, "/v1/steps/begin", begin).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fresh["state"], "fresh");
    let downstream_key = fresh["downstream_key"].clone();
    assert_eq!(downstream_key.as_str().map(str::len), Some(69));
    let (status, _) = server
        .post(
            SHOP,
            "/v1/steps/finish",
            json!({ "lease": first["lease"], "step": "label", "result": {"tracking": "T1"} }),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, fresh) = server
        .post(
            SHOP,
            "/v1/steps/begin",
            json!({ "lease": first["lease"], "step": "pickup" }),
        )
        .await;
    assert_eq!(fresh["state"], "fresh");
    // The holder dies here: its lease runs out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = server.claim(SHOP, "ship", "s-1", json!({})).await;
    assert_eq!(second["takeover"], true);
    let (_, done) = server
        .post(
            SHOP,
            "/v1/steps/begin",
            json!({ "lease": second["lease"], "step": "label" }),
        )
        .await;
    assert_eq!(
        done,
        json!({ "state": "done", "result": {"tracking": "T1"} })
    );
    let (_, doubt) = server
        .post(
            SHOP,
            "/v1/steps/begin",
            json!({ "lease": second["lease"], "step": "pickup" }),
        )
        .await;
    assert_eq!(doubt["state"], "in_doubt", "{doubt}");
    assert_eq!(doubt["attempt"], 1);
    // A finish sent again after its answer was lost, once the claim has
    // ended, is done if it had landed; another result is not.
    let finish = json!({ "lease": second["lease"], "step": "pickup", "result": "booked" });
    let (status, _) = server.post(SHOP, "/v1/steps/finish", finish.clone()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = server
        .post(SHOP, "/v1/release", json!({ "lease": second["lease"] }))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, answer) = server.post(SHOP, "/v1/steps/finish", finish).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{answer}");
    let (status, _) = server
        .post(
            SHOP,
            "/v1/steps/finish",
            json!({ "lease": second["lease"], "step": "pickup", "result": "other" }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, steps) = server.get(SHOP, "/v1/steps", "ship", "s-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        steps,
        json!({ "steps": [
            { "state": "finished", "name": "label", "result": {"tracking": "T1"} },
            { "state": "finished", "name": "pickup", "result": "booked" },
        ]})
    );
    server.stop().await;
}

#[tokio::test]
async fn a_claim_that_asks_to_wait_gets_the_running_duplicates_outcome() {
    let server = Server::start().await;
    let first = server.claim(SHOP, "w", "k", json!({})).await;
    let lease = first["lease"].clone();
    let started = std::time::Instant::now();
    let (waited, ()) = tokio::join!(
        server.claim(SHOP, "w", "k", json!({ "wait_ms": 4000 })),
        async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (status, _) = server
                .post(
                    SHOP,
                    "/v1/complete",
                    json!({ "lease": lease, "response": 7 }),
                )
                .await;
            assert_eq!(status, StatusCode::NO_CONTENT);
        }
    );
    assert_eq!(waited, json!({ "outcome": "completed", "response": 7 }));
    assert!(started.elapsed() < Duration::from_secs(3));

    // A wait longer than --max-wait is cut to it.
    let held = server.claim(SHOP, "w", "held", json!({})).await;
    assert_eq!(held["outcome"], "acquired");
    let started = std::time::Instant::now();
    let answer = server
        .claim(SHOP, "w", "held", json!({ "wait_ms": 600_000 }))
        .await;
    assert_eq!(answer["outcome"], "in_progress");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(15),
        "{took:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn concurrent_claims_of_one_key_acquire_it_once() {
    let server = Server::start().await;
    for round in 0..10 {
        let key = format!("k-{round}");
        let claims = (0..24).map(|_| server.claim(SHOP, "race", &key, json!({})));
        let answers = futures_util::future::join_all(claims).await;
        let acquired = answers
            .iter()
            .filter(|a| a["outcome"] == "acquired")
            .count();
        let waiting = answers
            .iter()
            .filter(|a| a["outcome"] == "in_progress")
            .count();
        assert_eq!((acquired, waiting), (1, 23), "round {round}");
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_problem_that_says_what_was_wrong() {
    let server = Server::with(|c| c.max_request_bytes = 1024).await;
    let acquired = server.claim(SHOP, "bad", "k", json!({})).await;
    let lease = acquired["lease"].clone();
    let mut bad_token = lease.clone();
    bad_token["token"] = json!("xyz");
    for (path, body, needle) in [
        ("/v1/claim", json!({ "scope": "s", "key": "a b" }), "key:"),
        ("/v1/claim", json!({ "scope": "s", "key": "" }), "key:"),
        ("/v1/claim", json!({ "scope": "", "key": "k" }), "scope:"),
        (
            "/v1/claim",
            json!({ "scope": "s".repeat(448), "key": "k" }),
            "scope: longer than 447 bytes",
        ),
        (
            "/v1/claim",
            json!({ "scope": "s", "key": "k", "lease_ms": 0 }),
            "lease_ms: 0 is outside",
        ),
        (
            "/v1/claim",
            json!({ "scope": "s", "key": "k", "retention_ms": u64::MAX }),
            "retention_ms",
        ),
        (
            "/v1/claim",
            json!({ "scope": "s", "key": "k", "lease_ms": -1 }),
            "lease_ms",
        ),
        (
            "/v1/claim",
            json!({ "scope": "s", "key": "k", "lease_ms": 1.5 }),
            "lease_ms: 1.5 is not a whole number",
        ),
        (
            "/v1/claim",
            json!({ "scope": "s", "key": "k", "lease_ms": 3_600_001 }),
            "over the server's --max-lease",
        ),
        (
            "/v1/extend",
            json!({ "lease": lease }),
            "missing field `lease_ms`",
        ),
        (
            "/v1/claim",
            json!({ "scope": "s", "key": "k", "extra": 1 }),
            "unknown field `extra`",
        ),
        ("/v1/claim", json!({ "scope": "s" }), "missing field `key`"),
        (
            "/v1/complete",
            json!({ "lease": bad_token, "response": 1 }),
            "lease.token",
        ),
        (
            "/v1/complete",
            json!({ "lease": lease, "response": 1, "messages": [
                { "id": "m-1", "destination": "events", "payload": "%%" }
            ] }),
            "messages[0].payload: not base64",
        ),
        (
            "/v1/complete",
            json!({ "lease": lease, "response": 1, "messages": [
                { "id": "m-1", "destination": "events", "payload": "" },
                { "id": "a b", "destination": "events", "payload": "" }
            ] }),
            "messages[1].id:",
        ),
        (
            "/v1/complete",
            json!({ "lease": lease, "response": 1, "messages": [
                { "id": "m-1", "destination": "", "payload": "" }
            ] }),
            "the destination is empty",
        ),
        (
            "/v1/complete",
            json!({ "lease": lease, "response": 1, "messages": [
                { "id": "m-1", "destination": "events", "payload": "", "to": "x" }
            ] }),
            "unknown field `to`",
        ),
        (
            "/v1/fail",
            json!({ "lease": lease, "class": "maybe", "message": "m" }),
            "unknown variant `maybe`",
        ),
        (
            "/v1/steps/begin",
            json!({ "lease": lease, "step": "$input" }),
            "step: starts with '$'",
        ),
    ] {
        let (status, answer) = server.post(SHOP, path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
        assert_eq!(problem_type(&answer), "bad-request");
        let detail = answer["detail"].as_str().unwrap_or("");
        assert!(detail.contains(needle), "{path}: {detail}");
    }
    let raw = |body: &'static str| {
        server
            .client
            .post(format!("http://{}/v1/claim", server.addr))
            .bearer_auth(SHOP)
            .body(body)
    };
    let (status, answer) = server.send(raw("{\"scope\": ")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let big = format!(r#"{{"lease":{lease},"response":"{}"}}"#, "x".repeat(2048));
    let (status, answer) = server
        .send(
            server
                .client
                .post(format!("http://{}/v1/complete", server.addr))
                .bearer_auth(SHOP)
                .body(big),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert_eq!(problem_type(&answer), "body-too-large");
    let (status, answer) = server.get(SHOP, "/v1/nope", "s", "k").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(problem_type(&answer), "not-found");
    let (status, answer) = server.get(SHOP, "/v1/claim", "s", "k").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{answer}");
    assert!(answer["detail"].as_str().unwrap_or("").contains("GET"));
    let (status, answer) = server
        .send(
            server
                .client
                .get(format!("http://{}/v1/record?scope=s", server.addr))
                .bearer_auth(SHOP),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    // None of it touched the record.
    let (_, record) = server.get(SHOP, "/v1/record", "bad", "k").await;
    assert_eq!(record["state"], "in_progress");
    assert_eq!(record["attempt"], 1);
    server.stop().await;
}

#[tokio::test]
async fn the_openapi_document_is_served_and_the_health_check_needs_no_token() {
    let server = Server::start().await;
    let doc = reqwest::get(format!("http://{}/openapi.yaml", server.addr))
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert!(doc.starts_with("openapi: 3.1.0"), "{doc}");
    for path in [
        "/v1/claim",
        "/v1/complete",
        "/v1/fail",
        "/v1/extend",
        "/v1/release",
        "/v1/steps/begin",
        "/v1/steps/finish",
        "/v1/record",
        "/v1/steps",
    ] {
        assert!(
            doc.contains(&format!("\n  {path}:\n")),
            "{path} undocumented"
        );
    }
    let health = reqwest::get(format!("http://{}/healthz", server.addr))
        .await
        .expect("get");
    assert_eq!(health.status(), StatusCode::OK);
    server.stop().await;
}

#[test]
fn without_tokens_only_loopback_is_served() {
    use clap::Parser;
    let args = |listen: &str| {
        let cli = idem_cli::Cli::parse_from(["idem", "serve", "--listen", listen]);
        match cli.command {
            idem_cli::Command::Serve(args) => args,
            other => panic!("{other:?}"),
        }
    };
    let open = args("127.0.0.1:0")
        .config(Default::default())
        .expect("loopback");
    assert!(open.tenants.is_open());
    let error = args("0.0.0.0:8700")
        .config(Default::default())
        .expect_err("public")
        .to_string();
    assert!(error.contains("without --tokens"), "{error}");
}

#[test]
fn a_default_lease_longer_than_the_longest_allowed_is_refused_at_start() {
    use clap::Parser;
    let cli = idem_cli::Cli::parse_from([
        "idem",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--lease",
        "2h",
        "--max-lease",
        "1h",
    ]);
    let idem_cli::Command::Serve(args) = cli.command else {
        panic!("serve")
    };
    let error = args
        .config(Default::default())
        .expect_err("lease over max-lease")
        .to_string();
    assert!(
        error.contains("--lease 2h is longer than --max-lease 1h"),
        "{error}"
    );
}

/// Without tokens, what a web page could send is refused: a request whose
/// `Host` is a name of the page's own (DNS rebinding) and a POST that is
/// not JSON (a form's `text/plain`, sent cross-origin without asking).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_only_json_addressed_to_a_loopback_name_is_served() {
    let server = Server::with(|config| config.tenants = Tenants::open()).await;
    let url = format!("http://{}/v1/claim", server.addr);
    let body = r#"{"scope":"s","key":"k"}"#;
    let send = |host: &str, content_type: &str| {
        server
            .client
            .post(&url)
            .header("host", host)
            .header("content-type", content_type)
            .body(body)
    };
    let (status, answer) = server
        .send(send("attacker.example:8700", "application/json"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(problem_type(&answer), "forbidden");
    assert!(answer["detail"]
        .as_str()
        .is_some_and(|d| d.contains("attacker.example")));
    let (status, answer) = server.send(send("localhost:8700", "text/plain")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{answer}");
    assert_eq!(problem_type(&answer), "forbidden");
    let (status, answer) = server
        .send(send("attacker.example", "application/json"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, _) = server
        .send(send("[::1]evil.example", "application/json"))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // HTTP/2 names the host in :authority, which is checked instead.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let answer = h2
        .post(format!("http://localhost:{}/v1/claim", server.addr.port()))
        .header("content-type", "application/json")
        .body(r#"{"scope":"s","key":"h2"}"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(answer.version(), reqwest::Version::HTTP_2);
    assert_eq!(answer.status(), StatusCode::OK);
    for host in [
        "localhost:8700",
        "127.0.0.1:8700",
        "[::1]:8700",
        "LOCALHOST",
    ] {
        let (status, answer) = server
            .send(send(host, "application/json; charset=utf-8"))
            .await;
        assert_eq!(status, StatusCode::OK, "{host}: {answer}");
    }
    server.stop().await;
}

/// With --tls-cert and --tls-key the claim API is HTTPS, so bearer tokens
/// never cross the network in cleartext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_served_over_tls_when_given_a_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certified =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).expect("write");
    std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write");
    let server = Server::with(|config| {
        config.tls = Some(idem_cli::tls::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        })
    })
    .await;
    let root = reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).expect("root");
    let client = reqwest::Client::builder()
        .add_root_certificate(root)
        .no_proxy()
        .build()
        .expect("client");
    let url = format!("https://localhost:{}/v1/claim", server.addr.port());
    let answer: Value = client
        .post(&url)
        .bearer_auth(SHOP)
        .json(&json!({ "scope": "tls", "key": "k-1" }))
        .send()
        .await
        .expect("sent over TLS")
        .json()
        .await
        .expect("JSON");
    assert_eq!(answer["outcome"], "acquired", "{answer}");
    let cleartext = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/claim", server.addr.port()))
        .bearer_auth(SHOP)
        .json(&json!({ "scope": "tls", "key": "k-2" }))
        .send()
        .await;
    assert!(
        cleartext.map_or(true, |r| !r.status().is_success()),
        "cleartext is not served"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_results_and_hashed_keys_leave_nothing_readable_in_the_store() {
    let files = tempfile::tempdir().expect("tempdir");
    let (keys, secret) = (files.path().join("keys"), files.path().join("secret"));
    std::fs::write(&keys, format!("k1:{}\n", "3c".repeat(32))).expect("write");
    std::fs::write(&secret, "4d".repeat(32)).expect("write");
    let secrets = idem_cli::admin::Secrets::read(Some(&keys), Some(&secret)).expect("secrets");
    let server = Server::with(|config| config.secrets = secrets).await;
    let key = "customer-77@example.com";

    let first = server.claim(SHOP, "charges", key, json!({})).await;
    assert_eq!(first["outcome"], "acquired");
    let lease = first["lease"].clone();
    let (_, begun) = server
        .post(
            SHOP,
            "/v1/steps/begin",
            json!({ "lease": lease, "step": "mint" }),
        )
        .await;
    assert_eq!(begun["state"], "fresh");
    let token = json!({ "token": "tok_s3cret" });
    let (status, _) = server
        .post(
            SHOP,
            "/v1/steps/finish",
            json!({ "lease": lease, "step": "mint", "result": token }),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, replayed) = server
        .post(
            SHOP,
            "/v1/steps/begin",
            json!({ "lease": lease, "step": "mint" }),
        )
        .await;
    assert_eq!(replayed["result"], token, "a sealed step opens for its run");
    let charge = json!({ "card": "4242424242424242" });
    for _ in 0..2 {
        // Sent twice, as a client whose answer was lost does: the second
        // try's bytes are sealed under another nonce and still match.
        let (status, answer) = server
            .post(
                SHOP,
                "/v1/complete",
                json!({ "lease": lease, "response": charge }),
            )
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{answer}");
    }

    let again = server.claim(SHOP, "charges", key, json!({})).await;
    assert_eq!(again["outcome"], "completed");
    assert_eq!(again["response"], charge);
    let (_, record) = server.get(SHOP, "/v1/record", "charges", key).await;
    assert_eq!(record["response"], charge);
    assert_eq!(record["key"], key, "callers see their own key");
    let (_, steps) = server.get(SHOP, "/v1/steps", "charges", key).await;
    assert_eq!(steps["steps"][0]["result"], token);

    let mut dump = Vec::new();
    for entry in std::fs::read_dir(server._dir.path()).expect("dir") {
        dump.extend(std::fs::read(entry.expect("entry").path()).expect("read"));
    }
    for shown in ["tok_s3cret", "4242424242424242", key] {
        assert!(
            !dump.windows(shown.len()).any(|w| w == shown.as_bytes()),
            "the store shows {shown}"
        );
    }
    server.stop().await;
}

#[test]
fn another_idem_serve_is_not_a_store_to_serve() {
    let remote = idem_remote::RemoteStore::builder("http://127.0.0.1:1")
        .expect("a URL")
        .build()
        .expect("a remote store");
    let tokens = vec![SHOP.to_owned()];
    let config =
        common::serve_config(Tenants::new([("shop", tokens.as_slice())]).expect("tenants"));
    let refused = serve::router(AnyStore::Remote(remote), config).err();
    let said = refused.map(|e| e.to_string()).unwrap_or_default();
    assert!(said.contains("not behind another idem serve"), "{said:?}");
}
