//! The transactional inbox against a real PostgreSQL: the dedup row and
//! the business write commit or roll back together, and concurrent
//! duplicates wait for the first delivery and then see its result.

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem::{Fingerprint, RecordId};
use idem_postgres::inbox::{Inbox, InboxError, InboxOutcome, PARTITIONS_AHEAD};
use tokio_postgres::{Client, IsolationLevel, NoTls};

const DAY: Duration = Duration::from_secs(24 * 3600);

use common::client;

/// A fresh schema with the inbox and an `accounts` table holding one
/// account with balance 0.
async fn setup(retention: Duration) -> (Inbox, String) {
    setup_with(|schema| Inbox::in_schema(schema, retention)).await
}

/// [`setup`] for the inbox `make` returns for the new schema.
async fn setup_with(make: impl FnOnce(&str) -> Inbox) -> (Inbox, String) {
    let schema = format!("inbox_{:016x}", rand::random::<u64>());
    let inbox = make(&schema);
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

/// The same delivery on a deadpool-postgres pooled connection, whose
/// statements the inbox prepares once per connection.
async fn deliver_pooled(
    pool: &deadpool_postgres::Pool,
    inbox: &Inbox,
    schema: &str,
    id: &RecordId,
) -> Result<InboxOutcome, InboxError> {
    let mut c = pool.get().await.expect("pooled connection");
    let tx = c.transaction().await.map_err(InboxError::Postgres)?;
    let outcome = inbox.claim(&tx, id, None).await?;
    if outcome == InboxOutcome::New {
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
    thirty_two_deliveries(setup(DAY).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_deliveries_credit_once_when_partitioned() {
    let partitioned = |schema: &str| Inbox::in_schema(schema, DAY).partitioned(DAY);
    thirty_two_deliveries(setup_with(partitioned).await).await;
}

async fn thirty_two_deliveries((inbox, schema): (Inbox, String)) {
    let (inbox, schema) = (Arc::new(inbox), Arc::new(schema));
    let id = RecordId::parse("payments", "msg-1").expect("id");
    let config: tokio_postgres::Config = common::url().parse().expect("url");
    let pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(config, NoTls))
        .max_size(16)
        .build()
        .expect("pool");
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    // Half on their own connections, half on pooled ones.
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (inbox, schema, id, barrier, pool) = (
                inbox.clone(),
                schema.clone(),
                id.clone(),
                barrier.clone(),
                pool.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                if i % 2 == 0 {
                    deliver(&inbox, &schema, &id).await
                } else {
                    deliver_pooled(&pool, &inbox, &schema, &id).await
                }
                .expect("deliver")
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

async fn count(c: &Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.expect("count").get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_made_ahead_and_dropped_once_their_rows_expired() {
    let second = Duration::from_secs(1);
    let (inbox, schema) =
        setup_with(|schema| Inbox::in_schema(schema, second).partitioned(second)).await;
    let partitions = format!(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = '{schema}.idem_inbox_p'::regclass"
    );
    let mut c = client().await;
    assert!(
        count(&c, &partitions).await > PARTITIONS_AHEAD,
        "setup made the current partition and the ones ahead"
    );
    let id = RecordId::parse("payments", "msg-6").expect("id");
    let tx = c.transaction().await.expect("begin");
    assert_eq!(
        inbox.claim(&tx, &id, None).await.expect("claim"),
        InboxOutcome::New
    );
    assert!(
        matches!(
            inbox.claim(&tx, &id, None).await.expect("claim again"),
            InboxOutcome::Duplicate { .. }
        ),
        "the row is live within its own transaction"
    );
    tx.commit().await.expect("commit");

    // Past its retention the row reads as absent: the key is new again,
    // in a later partition, while the expired row still sits in its own.
    // (No maintenance yet: setup made partitions for the next seconds.)
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let tx = c.transaction().await.expect("begin");
    assert_eq!(
        inbox
            .claim(&tx, &id, None)
            .await
            .expect("claim after expiry"),
        InboxOutcome::New
    );
    tx.commit().await.expect("commit");
    let rows = format!("SELECT count(*) FROM {schema}.idem_inbox_p");
    assert_eq!(count(&c, &rows).await, 2, "the expired row is still stored");

    // Once the first partition's range ended a retention ago, maintain
    // drops it; the live row's partition stays.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let done = inbox.maintain(&c).await.expect("maintain");
    assert!(!done.dropped.is_empty(), "{done:?}");
    assert!(!done.created.is_empty(), "new partitions ahead: {done:?}");
    assert!(
        count(&c, &rows).await <= 1,
        "the expired row went with its partition"
    );
    for name in &done.dropped {
        let exists = format!("SELECT count(*) FROM pg_class WHERE relname = '{name}' AND relnamespace = '{schema}'::regnamespace");
        assert_eq!(count(&c, &exists).await, 0, "{name} was dropped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partitioned_layout_refuses_what_it_cannot_keep_safe() {
    let partitioned = |schema: &str| Inbox::in_schema(schema, DAY).partitioned(DAY);
    let (inbox, schema) = setup_with(partitioned).await;
    let id = RecordId::parse("payments", "msg-7").expect("id");
    let mut c = client().await;
    let tx = c
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await
        .expect("begin repeatable read");
    let err = inbox
        .claim(&tx, &id, None)
        .await
        .expect_err("not read committed");
    assert!(matches!(err, InboxError::Isolation), "{err:?}");
    drop(tx);

    // Tables made, but no partition yet (a plain inbox's setup).
    let (_, other) = setup(DAY).await;
    let unmaintained = Inbox::in_schema(&other, DAY).partitioned(DAY);
    let tx = c.transaction().await.expect("begin");
    let err = unmaintained
        .claim(&tx, &id, None)
        .await
        .expect_err("no partition");
    assert!(
        matches!(&err, InboxError::NoPartition { table } if *table == format!("{other}.idem_inbox_p")),
        "{err:?}"
    );
    drop(tx);

    let plain = Inbox::in_schema(&schema, DAY);
    assert!(matches!(
        plain.maintain(&c).await,
        Err(InboxError::NotPartitioned)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn maintainers_side_by_side_do_each_step_once() {
    let second = Duration::from_secs(1);
    let (inbox, schema) =
        setup_with(|schema| Inbox::in_schema(schema, second).partitioned(second)).await;
    let mut c = client().await;
    for n in 0..3 {
        let tx = c.transaction().await.expect("begin");
        let id = RecordId::parse("payments", &format!("m{n}")).expect("id");
        inbox.claim(&tx, &id, None).await.expect("claim");
        tx.commit().await.expect("commit");
    }
    // Past the first partitions' ends plus the retention.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                let c = client().await;
                inbox.maintain(&c).await.expect("maintain side by side")
            })
        })
        .collect();
    let (mut created, mut dropped, mut worked) = (Vec::new(), Vec::new(), 0);
    for run in runs {
        let done = run.await.expect("maintainer");
        worked += usize::from(!done.busy);
        assert!(
            !done.busy || (done.created.is_empty() && done.dropped.is_empty()),
            "a busy maintainer does nothing: {done:?}"
        );
        created.extend(done.created);
        dropped.extend(done.dropped);
    }
    assert!(worked >= 1, "one of them worked");
    let (made, gone) = (created.len(), dropped.len());
    created.sort();
    created.dedup();
    dropped.sort();
    dropped.dedup();
    assert_eq!(created.len(), made, "no partition reported made twice");
    assert_eq!(dropped.len(), gone, "no partition reported dropped twice");
    assert!(!dropped.is_empty(), "the expired partitions were dropped");
    let rows = format!("SELECT count(*) FROM {schema}.idem_inbox_p");
    assert_eq!(count(&c, &rows).await, 0, "their rows went with them");

    // A maintainer that died holding the lease holds up the others only
    // until the lease runs out.
    let upkeep = |until: &str| {
        format!(
            "DELETE FROM {schema}.idem_inbox_p_upkeep;
             INSERT INTO {schema}.idem_inbox_p_upkeep VALUES (true, '\\x00', {until})"
        )
    };
    c.batch_execute(&upkeep("now() + interval '5 minutes'"))
        .await
        .expect("a live lease");
    assert!(inbox.maintain(&c).await.expect("maintain").busy);
    c.batch_execute(&upkeep("now() - interval '1 second'"))
        .await
        .expect("a lease run out");
    assert!(!inbox.maintain(&c).await.expect("maintain").busy);

    let tx = c.transaction().await.expect("begin");
    let id = RecordId::parse("payments", "after").expect("id");
    assert_eq!(
        inbox.claim(&tx, &id, None).await.expect("claim after"),
        InboxOutcome::New
    );
    tx.commit().await.expect("commit");
}
