//! The transactional inbox against a real MariaDB: the dedup row commits
//! or rolls back with the business write, a concurrent duplicate waits for
//! the first transaction and then sees what it did, at either isolation
//! level.

mod common;

use std::time::Duration;

use idem::{Fingerprint, RecordId};
use idem_mysql::inbox::{Inbox, InboxError, InboxOutcome};
use mysql_async::prelude::Queryable;
use mysql_async::{IsolationLevel, Pool, TxOpts};

/// A pool on a new database with the inbox set up and a `ledger` table
/// for business writes.
async fn setup(retention: Duration) -> (Pool, Inbox) {
    let pool = Pool::new(common::url("inbox").as_str());
    let inbox = Inbox::new(retention);
    let mut conn = pool.get_conn().await.expect("connect");
    inbox.setup(&mut conn).await.expect("setup");
    conn.query_drop("CREATE TABLE ledger (id VARCHAR(64) PRIMARY KEY, amount INT)")
        .await
        .expect("ledger");
    (pool, inbox)
}

fn id(key: &str) -> RecordId {
    RecordId::parse("payments", key).expect("id")
}

fn rr() -> TxOpts {
    let mut opts = TxOpts::default();
    opts.with_isolation_level(IsolationLevel::RepeatableRead);
    opts
}

async fn ledger(pool: &Pool) -> Vec<(String, i32)> {
    let mut conn = pool.get_conn().await.expect("connect");
    conn.query("SELECT id, amount FROM ledger ORDER BY id")
        .await
        .expect("ledger")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_then_duplicate_with_the_recorded_response() {
    let (pool, inbox) = setup(Duration::from_secs(3600)).await;
    let mut conn = pool.get_conn().await.expect("connect");
    let mut tx = conn.start_transaction(TxOpts::default()).await.expect("tx");
    assert_eq!(
        inbox.claim(&mut tx, &id("m1"), None).await.expect("claim"),
        InboxOutcome::New
    );
    tx.query_drop("INSERT INTO ledger VALUES ('m1', 1250)")
        .await
        .expect("write");
    inbox
        .set_response(&mut tx, &id("m1"), b"credited")
        .await
        .expect("response");
    let again = inbox.set_response(&mut tx, &id("m1"), b"twice").await;
    assert!(
        matches!(again, Err(InboxError::NotClaimed { .. })),
        "{again:?}"
    );
    tx.commit().await.expect("commit");

    let mut tx = conn.start_transaction(TxOpts::default()).await.expect("tx");
    assert_eq!(
        inbox.claim(&mut tx, &id("m1"), None).await.expect("claim"),
        InboxOutcome::Duplicate {
            response: Some(b"credited".to_vec())
        }
    );
    let other = Fingerprint::of_bytes(b"another message");
    assert_eq!(
        inbox
            .claim(&mut tx, &id("m1"), Some(other))
            .await
            .expect("claim"),
        InboxOutcome::Mismatch
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(ledger(&pool).await, [("m1".to_owned(), 1250)]);
}

/// A transaction that never commits (its connection cut, as when the
/// process dies) leaves neither the business write nor the dedup row: the
/// redelivery is new and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_cut_before_commit_leaves_neither_row() {
    let (pool, inbox) = setup(Duration::from_secs(3600)).await;
    let mut conn = pool.get_conn().await.expect("connect");
    let mut tx = conn.start_transaction(TxOpts::default()).await.expect("tx");
    assert_eq!(
        inbox.claim(&mut tx, &id("cut"), None).await.expect("claim"),
        InboxOutcome::New
    );
    tx.query_drop("INSERT INTO ledger VALUES ('cut', 1)")
        .await
        .expect("write");
    drop(tx);
    conn.disconnect().await.expect("cut");
    assert!(ledger(&pool).await.is_empty());
    let mut conn = pool.get_conn().await.expect("connect");
    let mut tx = conn.start_transaction(TxOpts::default()).await.expect("tx");
    assert_eq!(
        inbox.claim(&mut tx, &id("cut"), None).await.expect("claim"),
        InboxOutcome::New
    );
}

/// Two deliveries of one message at once, at both isolation levels: the
/// second waits on the first's row; it is a duplicate if the first
/// commits and new if the first rolls back. Exactly one credit either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_duplicate_waits_for_the_first_transaction() {
    for (level, commit) in [
        (TxOpts::default(), true),
        (TxOpts::default(), false),
        (rr(), true),
        (rr(), false),
    ] {
        let (pool, inbox) = setup(Duration::from_secs(3600)).await;
        let mut first = pool.get_conn().await.expect("connect");
        let mut tx = first.start_transaction(level.clone()).await.expect("tx");
        assert_eq!(
            inbox
                .claim(&mut tx, &id("race"), None)
                .await
                .expect("claim"),
            InboxOutcome::New
        );
        tx.query_drop("INSERT INTO ledger VALUES ('first', 1)")
            .await
            .expect("write");
        let second = tokio::spawn({
            let (pool, inbox, level) = (pool.clone(), inbox.clone(), level.clone());
            async move {
                let mut conn = pool.get_conn().await.expect("connect");
                let mut tx = conn.start_transaction(level).await.expect("tx");
                let started = std::time::Instant::now();
                let outcome = inbox
                    .claim(&mut tx, &id("race"), None)
                    .await
                    .expect("claim");
                if outcome == InboxOutcome::New {
                    tx.query_drop("INSERT INTO ledger VALUES ('second', 1)")
                        .await
                        .expect("write");
                }
                tx.commit().await.expect("commit");
                (outcome, started.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        let (outcome, waited) = second.await.expect("second");
        assert!(
            waited >= Duration::from_millis(200),
            "it waited: {waited:?}"
        );
        let credits = ledger(&pool).await;
        if commit {
            assert_eq!(outcome, InboxOutcome::Duplicate { response: None });
            assert_eq!(credits, [("first".to_owned(), 1)]);
        } else {
            assert_eq!(outcome, InboxOutcome::New);
            assert_eq!(credits, [("second".to_owned(), 1)]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_past_their_retention_are_new_again_and_purged() {
    let (pool, inbox) = setup(Duration::from_millis(300)).await;
    let mut conn = pool.get_conn().await.expect("connect");
    for key in ["old-1", "old-2"] {
        let mut tx = conn.start_transaction(TxOpts::default()).await.expect("tx");
        assert_eq!(
            inbox.claim(&mut tx, &id(key), None).await.expect("claim"),
            InboxOutcome::New
        );
        inbox
            .set_response(&mut tx, &id(key), b"done")
            .await
            .expect("response");
        tx.commit().await.expect("commit");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut tx = conn.start_transaction(TxOpts::default()).await.expect("tx");
    assert_eq!(
        inbox
            .claim(&mut tx, &id("old-1"), None)
            .await
            .expect("claim"),
        InboxOutcome::New,
        "past its retention, a key is new"
    );
    tx.commit().await.expect("commit");
    assert_eq!(inbox.purge_expired(&mut conn, 100).await.expect("purge"), 1);
    let left: Vec<Vec<u8>> = conn
        .query("SELECT `key` FROM idem_inbox")
        .await
        .expect("rows");
    assert_eq!(left, [b"old-1".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_without_its_table_says_how_to_make_it() {
    let pool = Pool::new(common::url("bare").as_str());
    let inbox = Inbox::new(Duration::from_secs(60));
    let mut conn = pool.get_conn().await.expect("connect");
    let mut tx = conn.start_transaction(TxOpts::default()).await.expect("tx");
    let error = inbox
        .claim(&mut tx, &id("x"), None)
        .await
        .expect_err("no table");
    assert!(matches!(error, InboxError::NotSetUp), "{error:?}");
    assert!(error.to_string().contains("Inbox::setup"), "{error}");
}
