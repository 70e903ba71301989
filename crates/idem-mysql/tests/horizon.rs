//! A late retry that arrives while a purge is dropping its key's expired
//! record, on a real MariaDB: the purge holds the record's row (as
//! `sql/purge_take.sql` does) and commits its memory of the key and the
//! delete together; the claim waits for the row, then reads the memory
//! and refuses. It never runs the key again, whichever side commits
//! first.

mod common;

use std::time::Duration;

use idem::horizon;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Fingerprint, GetRecord, RecordId, Store};
use idem_mysql::MySqlStore;
use mysql_async::prelude::Queryable;
use mysql_async::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_during_the_purge_of_its_key_waits_and_is_refused() {
    let url = common::url("race");
    let store = MySqlStore::builder(&format!("{url}?remember=30d"))
        .expect("valid URL")
        .connect()
        .await
        .expect("connect");
    let id = RecordId::parse("orders", "late-1").expect("valid id");
    let fingerprint = Fingerprint::of_bytes(b"the same request");
    let params = ClaimParams::new(Duration::from_secs(5), Duration::from_millis(300))
        .fingerprint(fingerprint);
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &params).await.expect("claim") else {
        panic!("a new key is acquired");
    };
    store
        .complete(&lease, "{}".into(), Duration::from_millis(300))
        .await
        .expect("complete");
    let expires_at = store
        .get(&id)
        .await
        .expect("read")
        .expect("held")
        .expires_at;
    tokio::time::sleep(Duration::from_millis(600)).await;

    // The purge's transaction: the expired row locked.
    let mut purge = mysql_async::Conn::from_url(&url).await.expect("connect");
    purge.query_drop("START TRANSACTION").await.expect("begin");
    let locked: Vec<mysql_async::Row> = purge
        .exec(
            "SELECT state FROM idem_records WHERE scope = ? AND `key` = ? FOR UPDATE",
            ("orders", "late-1"),
        )
        .await
        .expect("lock");
    assert_eq!(locked.len(), 1, "the expired record is still held");

    let late = tokio::spawn({
        let (store, id, params) = (store.clone(), id.clone(), params.clone());
        async move { store.claim(&id, &params).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !late.is_finished(),
        "the claim waits for the row the purge holds"
    );

    // The purge remembers the key and drops the record, then commits.
    purge
        .exec_drop(
            "INSERT INTO idem_horizon (digest, fingerprint, day) VALUES (?, ?, ?)",
            vec![
                Value::Int(horizon::packed(&horizon::digest(&id))),
                Value::Int(horizon::packed(&horizon::fingerprint_prefix(Some(
                    &fingerprint,
                )))),
                Value::from(horizon::day_of(expires_at)),
            ],
        )
        .await
        .expect("remember");
    purge
        .exec_drop(
            "DELETE FROM idem_records WHERE scope = ? AND `key` = ?",
            ("orders", "late-1"),
        )
        .await
        .expect("delete");
    purge.query_drop("COMMIT").await.expect("commit");

    let outcome = late.await.expect("task").expect("claim");
    assert!(
        matches!(outcome, ClaimOutcome::Forgotten { .. }),
        "the late retry is refused: {outcome:?}"
    );
    assert!(
        store.get(&id).await.expect("read").is_none(),
        "the refused claim left no record"
    );
    purge.disconnect().await.expect("disconnect");
}
