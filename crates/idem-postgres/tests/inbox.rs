//! The transactional inbox against a real PostgreSQL: the dedup row and
//! the business write commit or roll back together, and concurrent
//! duplicates wait for the first delivery and then see its result.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem::{Fingerprint, RecordId};
use idem_postgres::inbox::{Inbox, InboxError, InboxOutcome};
use tokio_postgres::{Client, IsolationLevel, NoTls};

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn client() -> Client {
    let (client, connection) = tokio_postgres::connect(&common::url(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// A fresh schema with the inbox and an `accounts` table holding one
/// account with balance 0.
async fn setup(retention: Duration) -> (Inbox, String) {
    let schema = format!("inbox_{:016x}", rand::random::<u64>());
    let inbox = Inbox::in_schema(&schema, retention);
    let mut c = client().await;
    inbox.setup(&mut c).await.expect("setup");
    c.batch_execute(&format!(
        "CREATE TABLE {schema}.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO {schema}.accounts VALUES (7, 0)"
    ))
    .await
    .expect("accounts");
    (inbox, schema)
}

async fn balance(schema: &str) -> i64 {
    client()
        .await
        .query_one(
            &format!("SELECT balance FROM {schema}.accounts WHERE id = 7"),
            &[],
        )
        .await
        .expect("balance")
        .get(0)
}

/// One delivery: claim, credit 100 and record a response in one
/// transaction. Returns what the claim found.
async fn deliver(inbox: &Inbox, schema: &str, id: &RecordId) -> Result<InboxOutcome, InboxError> {
    let mut c = client().await;
    let tx = c.transaction().await.map_err(InboxError::Postgres)?;
    let outcome = inbox.claim(&tx, id, None).await?;
    if outcome == InboxOutcome::New {
        // Hold the claim for a moment so the duplicates really queue on it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.execute(
            &format!("UPDATE {schema}.accounts SET balance = balance + 100 WHERE id = 7"),
            &[],
        )
        .await
        .map_err(InboxError::Postgres)?;
        inbox.set_response(&tx, id, b"credited").await?;
    }
    tx.commit().await.map_err(InboxError::Postgres)?;
    Ok(outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_deliveries_credit_once() {
    let (inbox, schema) = setup(DAY).await;
    let (inbox, schema) = (Arc::new(inbox), Arc::new(schema));
    let id = RecordId::parse("payments", "msg-1").expect("id");
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (inbox, schema, id, barrier) =
                (inbox.clone(), schema.clone(), id.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                deliver(&inbox, &schema, &id).await.expect("deliver")
            })
        })
        .collect();
    let mut new = 0;
    let mut duplicates = 0;
    for task in tasks {
        match task.await.expect("task") {
            InboxOutcome::New => new += 1,
            InboxOutcome::Duplicate { response } => {
                assert_eq!(response.as_deref(), Some(&b"credited"[..]));
                duplicates += 1;
            }
            InboxOutcome::Mismatch => panic!("no fingerprint was given"),
        }
    }
    assert_eq!((new, duplicates), (1, 31));
    assert_eq!(
        balance(&schema).await,
        100,
        "the balance changed exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handler_leaves_neither_its_write_nor_the_dedup_row() {
    let (inbox, schema) = setup(DAY).await;
    let id = RecordId::parse("payments", "msg-2").expect("id");
    let mut c = client().await;
    {
        let tx = c.transaction().await.expect("begin");
        assert_eq!(
            inbox.claim(&tx, &id, None).await.expect("claim"),
            InboxOutcome::New
        );
        tx.execute(
            &format!("UPDATE {schema}.accounts SET balance = balance + 100 WHERE id = 7"),
            &[],
        )
        .await
        .expect("credit");
        // The handler fails after its business write: the transaction is
        // dropped without commit, so it rolls back.
    }
    assert_eq!(balance(&schema).await, 0, "the write rolled back");
    let rows: i64 = c
        .query_one(&format!("SELECT count(*) FROM {schema}.idem_inbox"), &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 0, "the dedup row rolled back with it");
    // The redelivery is processed as new, and only once.
    assert_eq!(
        deliver(&inbox, &schema, &id).await.expect("redeliver"),
        InboxOutcome::New
    );
    assert!(matches!(
        deliver(&inbox, &schema, &id).await.expect("again"),
        InboxOutcome::Duplicate { .. }
    ));
    assert_eq!(balance(&schema).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_waits_for_a_rollback_and_then_runs() {
    let (inbox, schema) = setup(DAY).await;
    let id = RecordId::parse("payments", "msg-3").expect("id");
    let mut first = client().await;
    let tx = first.transaction().await.expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id, None).await.expect("claim"),
        InboxOutcome::New
    );
    let waiting = {
        let (inbox, schema, id) = (inbox.clone(), schema.clone(), id.clone());
        tokio::spawn(async move { deliver(&inbox, &schema, &id).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the duplicate waits for the first transaction"
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(
        waiting.await.expect("task").expect("deliver"),
        InboxOutcome::New
    );
    assert_eq!(balance(&schema).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprints_expiry_and_purge() {
    let (inbox, schema) = setup(Duration::from_millis(300)).await;
    let id = RecordId::parse("payments", "msg-4").expect("id");
    let (a, b) = (Fingerprint::of_bytes(b"a"), Fingerprint::of_bytes(b"b"));
    let mut c = client().await;
    let tx = c.transaction().await.expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id, Some(a)).await.expect("claim"),
        InboxOutcome::New
    );
    tx.commit().await.expect("commit");
    let tx = c.transaction().await.expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id, Some(b)).await.expect("claim"),
        InboxOutcome::Mismatch
    );
    assert_eq!(
        inbox.claim(&tx, &id, Some(a)).await.expect("claim"),
        InboxOutcome::Duplicate { response: None }
    );
    let err = inbox
        .set_response(
            &tx,
            &RecordId::parse("payments", "never").expect("id"),
            b"x",
        )
        .await;
    assert!(matches!(err, Err(InboxError::NotClaimed { .. })), "{err:?}");
    tx.rollback().await.expect("rollback");

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(inbox.purge_expired(&c, 10).await.expect("purge"), 1);
    let tx = c.transaction().await.expect("begin");
    assert_eq!(
        inbox
            .claim(&tx, &id, Some(b))
            .await
            .expect("claim after expiry"),
        InboxOutcome::New,
        "an expired row is absent"
    );
    tx.commit().await.expect("commit");
    let _ = schema;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_and_serializable_duplicates_give_typed_errors() {
    let mut c = client().await;
    let missing = Inbox::in_schema("no_such_schema", DAY);
    let tx = c.transaction().await.expect("begin");
    let err = missing
        .claim(&tx, &RecordId::parse("s", "k").expect("id"), None)
        .await
        .expect_err("no table");
    assert!(matches!(err, InboxError::NotSetUp { .. }), "{err:?}");
    assert!(
        err.to_string().contains("no_such_schema.idem_inbox"),
        "{err}"
    );
    drop(tx);

    let (inbox, _schema) = setup(DAY).await;
    let id = RecordId::parse("payments", "msg-5").expect("id");
    let mut other = client().await;
    let first = c.transaction().await.expect("begin");
    let second = other
        .build_transaction()
        .isolation_level(IsolationLevel::Serializable)
        .start()
        .await
        .expect("begin serializable");
    // The second transaction's snapshot is taken before the first commits.
    second.query_one("SELECT 1", &[]).await.expect("snapshot");
    assert_eq!(
        inbox.claim(&first, &id, None).await.expect("claim"),
        InboxOutcome::New
    );
    first.commit().await.expect("commit");
    let err = inbox
        .claim(&second, &id, None)
        .await
        .expect_err("serialization failure");
    assert!(err.is_retryable(), "{err:?}");
}
