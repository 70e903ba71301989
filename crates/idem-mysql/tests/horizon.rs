//! A late retry that arrives while a purge is dropping its key's expired
//! record, on a real MariaDB: the purge holds the record's row (as
//! `sql/purge_take.sql` does) and commits its memory of the key and the
//! delete together; the claim waits for the row, then reads the memory
//! and refuses. It never runs the key again, whichever side commits
//! first.

mod common;

use std::num::NonZeroUsize;
use std::time::Duration;

use idem::horizon;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Fingerprint, GetRecord, KeyRules, PurgeExpired, RecordId, Scope, Store};
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

/// A purge of many records with the longest keys remembers and deletes
/// them all, its statements split to stay far below the server's largest
/// packet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_of_many_long_keys_remembers_every_one() {
    let store = MySqlStore::builder(&format!("{}?remember=30d", common::url("long")))
        .expect("valid URL")
        .connect()
        .await
        .expect("connect");
    let retention = Duration::from_millis(300);
    let params = ClaimParams::new(Duration::from_secs(5), retention)
        .fingerprint(Fingerprint::of_bytes(b"request"));
    // Keys of 2,048 bytes, the most the store takes.
    let rules = KeyRules::default().max_len(NonZeroUsize::new(2048).expect("not zero"));
    let scope = Scope::new("orders").expect("scope");
    let ids: Vec<RecordId> = (0..300)
        .map(|n| {
            let key = rules
                .parse(&format!("{n:04}{}", "k".repeat(2044)))
                .expect("key");
            RecordId::new(scope.clone(), key)
        })
        .collect();
    for id in &ids {
        let ClaimOutcome::Acquired(lease) = store.claim(id, &params).await.expect("claim") else {
            panic!("a new key is acquired");
        };
        store
            .complete(&lease, "{}".into(), retention)
            .await
            .expect("complete");
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(store.purge_expired(1000).await.expect("purge"), 300);
    for id in [&ids[0], &ids[150], &ids[299]] {
        assert!(
            matches!(
                store.claim(id, &params).await.expect("claim"),
                ClaimOutcome::Forgotten { .. }
            ),
            "{} is remembered",
            &id.key().as_str()[..4]
        );
    }
}
