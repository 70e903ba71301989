//! The transactional inbox inside sqlx transactions, against a real
//! PostgreSQL: the same guarantees as with tokio-postgres, and the two
//! drivers share one inbox table safely.

#![cfg(feature = "sqlx")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem::{Fingerprint, RecordId};
use idem_postgres::inbox::{Inbox, InboxError, InboxOutcome};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, Connection, PgPool};
use tokio_postgres::NoTls;

const DAY: Duration = Duration::from_secs(24 * 3600);

async fn pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(40)
        .connect(&common::url())
        .await
        .expect("sqlx pool")
}

/// A fresh schema with idem's tables (applied through sqlx, as a project
/// with its own migrations would) and one account with balance 0.
async fn setup(pool: &PgPool) -> (Inbox, String) {
    let schema = format!("sqlx_{:016x}", rand::random::<u64>());
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(pool)
        .await
        .expect("schema");
    for migration in idem_postgres::migrations(&schema) {
        sqlx::raw_sql(AssertSqlSafe(migration.sql))
            .execute(pool)
            .await
            .expect("migration");
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {schema}.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO {schema}.accounts VALUES (7, 0)"
    )))
    .execute(pool)
    .await
    .expect("accounts");
    (Inbox::in_schema(&schema, DAY), schema)
}

async fn balance(pool: &PgPool, schema: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT balance FROM {schema}.accounts WHERE id = 7"
    )))
    .fetch_one(pool)
    .await
    .expect("balance")
}

fn credit(schema: &str) -> String {
    format!("UPDATE {schema}.accounts SET balance = balance + 100 WHERE id = 7")
}

/// One delivery through sqlx: claim, credit 100, record a response.
async fn deliver_sqlx(
    pool: &PgPool,
    inbox: &Inbox,
    schema: &str,
    id: &RecordId,
) -> Result<InboxOutcome, InboxError> {
    let mut tx = pool.begin().await.map_err(InboxError::Sqlx)?;
    let outcome = inbox.claim(&mut tx, id, None).await?;
    if outcome == InboxOutcome::New {
        // Hold the claim for a moment so the duplicates really queue on it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        sqlx::query(AssertSqlSafe(credit(schema)))
            .execute(&mut *tx)
            .await
            .map_err(InboxError::Sqlx)?;
        inbox.set_response(&mut tx, id, b"credited").await?;
    }
    tx.commit().await.map_err(InboxError::Sqlx)?;
    Ok(outcome)
}

/// The same delivery through tokio-postgres.
async fn deliver_tokio(
    inbox: &Inbox,
    schema: &str,
    id: &RecordId,
) -> Result<InboxOutcome, InboxError> {
    let (mut client, connection) = tokio_postgres::connect(&common::url(), NoTls)
        .await
        .map_err(InboxError::Postgres)?;
    tokio::spawn(connection);
    let tx = client.transaction().await.map_err(InboxError::Postgres)?;
    let outcome = inbox.claim(&tx, id, None).await?;
    if outcome == InboxOutcome::New {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tx.execute(&credit(schema), &[])
            .await
            .map_err(InboxError::Postgres)?;
        inbox.set_response(&tx, id, b"credited").await?;
    }
    tx.commit().await.map_err(InboxError::Postgres)?;
    Ok(outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_deliveries_through_both_drivers_credit_once() {
    let pool = pool().await;
    let (inbox, schema) = setup(&pool).await;
    let (inbox, schema) = (Arc::new(inbox), Arc::new(schema));
    let id = RecordId::parse("payments", "msg-1").expect("id");
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (pool, inbox, schema, id, barrier) = (
                pool.clone(),
                inbox.clone(),
                schema.clone(),
                id.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                if i % 2 == 0 {
                    deliver_sqlx(&pool, &inbox, &schema, &id).await
                } else {
                    deliver_tokio(&inbox, &schema, &id).await
                }
                .expect("deliver")
            })
        })
        .collect();
    let (mut new, mut duplicates) = (0, 0);
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
        balance(&pool, &schema).await,
        100,
        "the balance changed exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sqlx_handler_leaves_neither_its_write_nor_the_dedup_row() {
    let pool = pool().await;
    let (inbox, schema) = setup(&pool).await;
    let id = RecordId::parse("payments", "msg-2").expect("id");
    {
        let mut tx = pool.begin().await.expect("begin");
        assert_eq!(
            inbox.claim(&mut tx, &id, None).await.expect("claim"),
            InboxOutcome::New
        );
        sqlx::query(AssertSqlSafe(credit(&schema)))
            .execute(&mut *tx)
            .await
            .expect("credit");
        // The handler fails after its business write: the transaction is
        // dropped without commit, so it rolls back.
    }
    assert_eq!(balance(&pool, &schema).await, 0, "the write rolled back");
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.idem_inbox"
    )))
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(rows, 0, "the dedup row rolled back with it");
    assert_eq!(
        deliver_sqlx(&pool, &inbox, &schema, &id)
            .await
            .expect("redeliver"),
        InboxOutcome::New
    );
    assert!(matches!(
        deliver_sqlx(&pool, &inbox, &schema, &id)
            .await
            .expect("again"),
        InboxOutcome::Duplicate { .. }
    ));
    assert_eq!(balance(&pool, &schema).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_fingerprints_purge_and_typed_errors() {
    let pool = pool().await;
    let (_, schema) = setup(&pool).await;
    let inbox = Inbox::in_schema(&schema, Duration::from_millis(300));
    let id = RecordId::parse("payments", "msg-3").expect("id");
    let (a, b) = (Fingerprint::of_bytes(b"a"), Fingerprint::of_bytes(b"b"));
    let mut tx = pool.begin().await.expect("begin");
    assert_eq!(
        inbox.claim(&mut tx, &id, Some(a)).await.expect("claim"),
        InboxOutcome::New
    );
    tx.commit().await.expect("commit");
    let mut tx = pool.begin().await.expect("begin");
    assert_eq!(
        inbox.claim(&mut tx, &id, Some(b)).await.expect("claim"),
        InboxOutcome::Mismatch
    );
    let never = RecordId::parse("payments", "never").expect("id");
    let err = inbox.set_response(&mut tx, &never, b"x").await;
    assert!(matches!(err, Err(InboxError::NotClaimed { .. })), "{err:?}");
    tx.rollback().await.expect("rollback");

    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut connection = pool.acquire().await.expect("connection");
    assert_eq!(
        inbox
            .purge_expired(&mut *connection, 10)
            .await
            .expect("purge"),
        1
    );

    let missing = Inbox::in_schema("no_such_schema", DAY);
    let mut tx = pool.begin().await.expect("begin");
    let err = missing
        .claim(&mut tx, &id, None)
        .await
        .expect_err("no table");
    assert!(
        matches!(&err, InboxError::NotSetUp { table } if table == "no_such_schema.idem_inbox"),
        "{err:?}"
    );
    drop(tx);

    // A serializable duplicate whose snapshot predates the first commit:
    // a serialization failure, which is retryable.
    let mut first = pool.begin().await.expect("begin");
    let mut second = pool.acquire().await.expect("connection");
    let mut second = second
        .begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .await
        .expect("begin serializable");
    sqlx::query("SELECT 1")
        .execute(&mut *second)
        .await
        .expect("snapshot");
    let inbox = Inbox::in_schema(&schema, DAY);
    let fresh = RecordId::parse("payments", "msg-4").expect("id");
    assert_eq!(
        inbox.claim(&mut first, &fresh, None).await.expect("claim"),
        InboxOutcome::New
    );
    first.commit().await.expect("commit");
    let err = inbox
        .claim(&mut second, &fresh, None)
        .await
        .expect_err("serialization failure");
    assert!(matches!(err, InboxError::Sqlx(_)), "{err:?}");
    assert!(err.is_retryable(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_partitioned_layout_works_through_sqlx() {
    let pool = pool().await;
    let (_, schema) = setup(&pool).await;
    let inbox = Arc::new(Inbox::in_schema(&schema, DAY).partitioned(DAY));
    let (client, connection) = tokio_postgres::connect(&common::url(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let made = inbox.maintain(&client).await.expect("maintain");
    assert!(!made.created.is_empty(), "{made:?}");

    let id = RecordId::parse("payments", "msg-5").expect("id");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (pool, inbox, schema, id) =
                (pool.clone(), inbox.clone(), schema.clone(), id.clone());
            tokio::spawn(async move { deliver_sqlx(&pool, &inbox, &schema, &id).await })
        })
        .collect();
    let mut new = 0;
    for task in tasks {
        if task.await.expect("task").expect("deliver") == InboxOutcome::New {
            new += 1;
        }
    }
    assert_eq!(new, 1);
    assert_eq!(balance(&pool, &schema).await, 100);

    let mut connection = pool.acquire().await.expect("connection");
    let mut tx = connection
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .expect("begin repeatable read");
    let err = inbox
        .claim(&mut tx, &id, None)
        .await
        .expect_err("not read committed");
    assert!(matches!(err, InboxError::Isolation), "{err:?}");
}
