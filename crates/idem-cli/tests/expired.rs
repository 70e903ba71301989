//! Keys after the retention, through the gateway binary on its default
//! embedded store: a retry that comes after its record expired is 410
//! `key-expired` and never reaches the upstream, also after an `idem
//! purge` run by another process that was not told to remember (the
//! memory is kept in the store file); the same key with another body runs;
//! `--remember-expired 0` turns it off; on Redis, where the memory is
//! kept in RAM, the flag turns it on; a store that cannot remember is
//! refused when the flag asks for it.

mod common;

use std::process::Command;

use common::process::{late_retry, purge};
use common::{post, problem};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_is_410_before_and_after_a_purge_elsewhere() {
    let dir = tempfile::tempdir().expect("dir");
    let store = format!("sqlite:{}", dir.path().join("idem.db").display());
    let (up, _gw, url, late) = late_retry(&store, &[]).await;
    let detail = problem(late, 410, "key-expired").await;
    assert!(
        detail.contains("second ago") || detail.contains("seconds ago"),
        "{detail}"
    );

    purge(&store);
    problem(post(&url, Some("order-1")).await, 410, "key-expired").await;
    assert_eq!(
        up.runs("/charge"),
        1,
        "late retries never reach the upstream"
    );

    let reused = common::client()
        .post(&url)
        .header("idempotency-key", "order-1")
        .header("content-type", "application/json")
        .body(r#"{"amount":5}"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(
        reused.status(),
        201,
        "another request under an old key runs"
    );
    assert_eq!(up.runs("/charge"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembering_can_be_turned_off() {
    let dir = tempfile::tempdir().expect("dir");
    let store = format!("sqlite:{}", dir.path().join("idem.db").display());
    let (up, _gw, _, late) = late_retry(&store, &["--remember-expired", "0"]).await;
    assert_eq!(late.status(), 201);
    assert_eq!(up.runs("/charge"), 2, "forgotten, as asked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_flag_turns_remembering_on() {
    let redis = idem_testkit::servers::redis::RedisServer::shared().expect("redis-server");
    let namespace = || {
        format!(
            "{}?namespace=expired-{:016x}",
            redis.url(),
            rand::random::<u64>()
        )
    };
    let (up, unasked, _, late) = late_retry(&namespace(), &[]).await;
    assert_eq!(late.status(), 201, "not remembered unless asked");
    assert_eq!(up.runs("/charge"), 2);
    drop(unasked);

    let (up, _gw, _, late) = late_retry(&namespace(), &["--remember-expired", "7d"]).await;
    problem(late, 410, "key-expired").await;
    assert_eq!(
        up.runs("/charge"),
        1,
        "the late retry never reached the upstream"
    );
}

#[test]
fn a_store_that_cannot_remember_is_refused_when_asked_to() {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", "http://127.0.0.1:9", "proxy"])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9",
        ])
        .args(["--remember-expired", "7d"])
        .env("IDEM_LOG", "warn")
        .output()
        .expect("ran");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot remember expired keys"), "{stderr}");
}
