//! What the gateway keeps of a response for its replays (`--keep`) and
//! sealing at rest (`--keyring`), end to end over the embedded store: the
//! client whose request ran gets the whole response, replays get what was
//! kept and say so, and the store's files show none of the secrets.

mod common;

use common::*;

/// Every byte of the store's files (the database and its WAL).
fn dump(dir: &tempfile::TempDir) -> Vec<u8> {
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            bytes.extend(std::fs::read(path).expect("read"));
        }
    }
    bytes
}

fn shows(dump: &[u8], secret: &str) -> bool {
    dump.windows(secret.len()).any(|w| w == secret.as_bytes())
}

async fn gateway(dir: &tempfile::TempDir, keep: &str, keyring: bool) -> (Upstream, Gateway) {
    let (up, addr) = start_upstream().await;
    let mut config = config(addr);
    config.keep = idem_http::KeepRules::parse(keep).expect("valid --keep");
    config.max_response_bytes = 1024;
    if keyring {
        config.keyring = Some(
            idem::codec::Keyring::parse(
                "2026-11:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
            )
            .expect("valid keyring"),
        );
    }
    let gw = Gateway::start(sqlite(dir), config).await;
    (up, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_only_routes_replay_the_status_and_store_no_body() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, gw) = gateway(&dir, "/secret=status-only:location", false).await;
    let url = format!("{}/secret", gw.url);
    let first = post(&url, Some("mint-1")).await;
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replay-kept").is_none());
    assert_eq!(first.headers()["x-api-key"], "key-s3cret");
    let body = first.text().await.expect("body");
    assert!(
        body.contains("tok_s3cret"),
        "its own client gets the whole answer: {body}"
    );

    let again = post(&url, Some("mint-1")).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["idempotent-replay-kept"], "status-only");
    assert_eq!(again.headers()["location"], "/secret/1");
    assert!(again.headers().get("x-api-key").is_none());
    assert_eq!(again.bytes().await.expect("body").len(), 0);
    assert_eq!(up.runs("/secret"), 1, "a replay, never a second run");

    // Other routes keep everything.
    let charge = format!("{}/charge", gw.url);
    let whole = post(&charge, Some("c-1"))
        .await
        .bytes()
        .await
        .expect("body");
    let replay = post(&charge, Some("c-1")).await;
    assert!(replay.headers().get("idempotent-replay-kept").is_none());
    assert_eq!(replay.bytes().await.expect("body"), whole);
    gw.shutdown().await;
    let dump = dump(&dir);
    for secret in SECRETS {
        assert!(!shows(&dump, secret), "the store shows {secret}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_too_large_to_store_is_passed_on_and_its_status_kept() {
    let dir = tempfile::tempdir().expect("dir");
    // `/big` answers 4096 bytes; the store takes 1024.
    let (up, gw) = gateway(&dir, "/big=status-only", false).await;
    let url = format!("{}/big", gw.url);
    let first = post(&url, Some("big-1")).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.bytes().await.expect("body").len(), 4096);
    let again = post(&url, Some("big-1")).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["idempotent-replay-kept"], "status-only");
    assert_eq!(again.bytes().await.expect("body").len(), 0);
    assert_eq!(up.runs("/big"), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_routes_replay_with_values_replaced() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, gw) = gateway(&dir, "redacted:/token,/card/number,x-api-key", false).await;
    let url = format!("{}/secret", gw.url);
    let first = post(&url, Some("r-1")).await;
    assert!(first.text().await.expect("body").contains("tok_s3cret"));
    let again = post(&url, Some("r-1")).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replay-kept"], "redacted");
    assert_eq!(again.headers()["x-api-key"], idem_http::REDACTED);
    let json: serde_json::Value = again.json().await.expect("json");
    assert_eq!(
        json,
        serde_json::json!({"id":1,"token":"[redacted]","card":{"number":"[redacted]","brand":"visa"}})
    );
    assert_eq!(up.runs("/secret"), 1);
    gw.shutdown().await;
    let dump = dump(&dir);
    for secret in SECRETS {
        assert!(!shows(&dump, secret), "the store shows {secret}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_responses_replay_byte_for_byte_and_the_store_shows_none() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, gw) = gateway(&dir, "", true).await;
    let url = format!("{}/secret", gw.url);
    let first = post(&url, Some("s-1")).await.bytes().await.expect("body");
    let again = post(&url, Some("s-1")).await;
    assert!(again.headers().get("idempotent-replay-kept").is_none());
    assert_eq!(again.headers()["x-api-key"], "key-s3cret");
    assert_eq!(again.bytes().await.expect("body"), first);
    assert_eq!(up.runs("/secret"), 1);
    gw.shutdown().await;
    let dump = dump(&dir);
    for secret in SECRETS {
        assert!(!shows(&dump, secret), "the store shows {secret}");
    }

    // Without the keyring the record does not open: a clear 500, never
    // a second run.
    let (up, gw) = gateway(&dir, "", false).await;
    let refused = post(&format!("{}/secret", gw.url), Some("s-1")).await;
    let detail = problem(refused, 500, "stored-response-unreadable").await;
    assert!(detail.contains("no keyring"), "{detail}");
    assert_eq!(up.runs("/secret"), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_keys_hide_the_key_and_inspect_finds_it_with_the_secret() {
    let dir = tempfile::tempdir().expect("dir");
    let secrets = tempfile::tempdir().expect("secrets dir");
    let keyring = secrets.path().join("keys");
    let secret = secrets.path().join("key-secret");
    std::fs::write(&keyring, format!("2026-11:{}\n", "11".repeat(32))).expect("write");
    std::fs::write(&secret, format!("{}\n", "22".repeat(32))).expect("write");

    let (up, addr) = start_upstream().await;
    let mut config = config(addr);
    config.keyring = Some(idem::codec::Keyring::from_file(&keyring).expect("keyring"));
    config.key_hasher = Some(idem::key_hash::KeyHasher::from_file(&secret).expect("secret"));
    let gw = Gateway::start(sqlite(&dir), config).await;
    let url = format!("{}/secret", gw.url);
    let first = post(&url, Some("order-secret-77"))
        .await
        .bytes()
        .await
        .expect("body");
    let again = post(&url, Some("order-secret-77")).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.expect("body"), first);
    assert_eq!(up.runs("/secret"), 1);
    gw.shutdown().await;
    let dump = dump(&dir);
    for shown in SECRETS.iter().chain(&["order-secret-77"]) {
        assert!(!shows(&dump, shown), "the store shows {shown}");
    }

    let store = sqlite(&dir);
    let clear = idem::RecordId::parse("http POST /secret", "order-secret-77").expect("id");
    let plain = idem_cli::admin::Secrets::read(None, None).expect("none");
    assert!(
        idem_cli::admin::inspect(&store, &plain.stored_id(&clear), &plain)
            .await
            .expect("inspect")
            .is_none(),
        "the clear key is not what is stored"
    );
    let given = idem_cli::admin::Secrets::read(Some(&keyring), Some(&secret)).expect("read");
    let record = idem_cli::admin::inspect(&store, &given.stored_id(&clear), &given)
        .await
        .expect("inspect")
        .expect("found by the clear key, hashed");
    assert_eq!(record["state"], "completed");
    assert_eq!(record["response"]["envelope"], "sealed");
    assert_eq!(record["response"]["sealed_with"], "2026-11");
    assert_eq!(record["response"]["http"]["status"], 201);
    assert_eq!(record["response"]["http"]["kept"], "full");
    assert!(record["key"].as_str().expect("key").starts_with("hk1-"));
}
