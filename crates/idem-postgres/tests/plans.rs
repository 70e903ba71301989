//! The writes that end a claim, run as PostgreSQL runs them on a pooled
//! connection (prepared, and planned generically while the table was
//! empty), read their own record, not every record in progress: planned
//! through the index of abandoned records, or as a scan of the table, a
//! completion among thousands in progress (the outbox's markers while a
//! broker is away, long handlers) took milliseconds. And a batch of
//! completions whose row another transaction changed while it waited to
//! lock it is still stored.

mod common;

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Completion, Lease};
use idem::{CompleteMany, RecordId, State, Store};

/// Records in progress in one scope while the writes are measured.
const IN_PROGRESS: usize = 20_000;

/// The pages (shared buffers hit or read) that the write `sql` touches to
/// complete one of `IN_PROGRESS` records in progress (checked done), run
/// as a pooled connection runs it: prepared, and planned generically on
/// its first run while the table was empty. `args(key)` are its
/// parameters for a key.
async fn pages_touched(
    store: &idem_postgres::PgStore,
    sql: &str,
    args: impl Fn(&str) -> String,
) -> u64 {
    let client = common::client().await;
    client
        .batch_execute(&format!(
            "SET plan_cache_mode = force_generic_plan; PREPARE write AS {sql}; \
             EXECUTE write({});",
            args("absent")
        ))
        .await
        .expect("prepared and planned on the empty table");
    client
        .batch_execute(&format!(
            "INSERT INTO {}.idem_records (scope, key, state, attempt, fence, token, \
             lease_until, created_at, updated_at, expires_at) \
             SELECT 'orders', 'k' || g, 'in_progress', 1, g, {TOKEN}, \
                    now() + interval '1 hour', now(), now(), now() + interval '1 day' \
             FROM generate_series(1, {IN_PROGRESS}) g",
            store.schema()
        ))
        .await
        .expect("records in progress");
    let plan: Vec<String> = client
        .query(
            &format!("EXPLAIN (ANALYZE, BUFFERS) EXECUTE write({})", args("k7")),
            &[],
        )
        .await
        .expect("explain")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let buffers = plan
        .iter()
        .find(|line| line.trim_start().starts_with("Buffers:"))
        .unwrap_or_else(|| panic!("the plan counts buffers:\n{}", plan.join("\n")));
    let count = |what: &str| -> u64 {
        buffers
            .split_whitespace()
            .find_map(|word| word.strip_prefix(what)?.parse().ok())
            .unwrap_or(0)
    };
    let state: String = client
        .query_one(
            &format!(
                "SELECT state FROM {}.idem_records WHERE scope = 'orders' AND key = 'k7'",
                store.schema()
            ),
            &[],
        )
        .await
        .expect("k7 is there")
        .get(0);
    assert_eq!(state, "completed", "the write completed k7");
    count("hit=") + count("read=")
}

/// The token of the records in progress, as SQL.
const TOKEN: &str = r"'\x00112233445566778899aabbccddeeff'::bytea";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_reads_its_own_record_however_many_are_in_progress() {
    let single = common::store("plans").await;
    let touched = pages_touched(&single, single.complete_sql(), |key| {
        format!("'orders', '{key}', {TOKEN}, '\\x'::bytea, 60000")
    })
    .await;
    assert!(
        touched < 40,
        "complete touched {touched} pages among {IN_PROGRESS} records in progress"
    );
    let many = common::store("plans").await;
    let touched = pages_touched(&many, many.complete_many_sql(), |key| {
        format!(
            "array['orders', 'orders'], array['{key}', '{key}x'], array[{TOKEN}, {TOKEN}], \
             array['\\x'::bytea, '\\x'::bytea], array[60000::float8, 60000]"
        )
    })
    .await;
    assert!(
        touched < 40,
        "complete_many touched {touched} pages among {IN_PROGRESS} records in progress"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_completions_whose_row_changed_while_it_waited_is_stored() {
    let store = common::store("plans").await;
    let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600));
    let mut leases: Vec<Lease> = Vec::new();
    for key in ["k1", "k2"] {
        let id = RecordId::parse("orders", key).expect("valid id");
        match store.claim(&id, &params).await.expect("claim") {
            ClaimOutcome::Acquired(lease) => leases.push(lease),
            other => panic!("a fresh key is acquired, not {}", other.label()),
        }
    }
    // Another transaction changes k1's row (as a waiter marks it) and
    // holds it while the batch starts.
    let mut other = common::client().await;
    let tx = other.transaction().await.expect("begin");
    let marked = tx
        .execute(
            &format!(
                "UPDATE {}.idem_records SET waited = true WHERE key = 'k1'",
                store.schema()
            ),
            &[],
        )
        .await
        .expect("update");
    assert_eq!(marked, 1);
    let completions: Vec<Completion> = leases
        .iter()
        .map(|lease| Completion::new(lease.clone(), Bytes::from_static(b"done"), params.retention))
        .collect();
    let batch = tokio::spawn({
        let store = store.clone();
        async move { store.complete_many(&completions).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!batch.is_finished(), "the batch waits for k1's row");
    tx.commit().await.expect("commit");
    let answers = batch.await.expect("joined").expect("the batch ran");
    assert!(
        answers.iter().all(Result::is_ok),
        "both completions are stored: {answers:?}"
    );
    for lease in &leases {
        let record = store.peek(&lease.id).await.expect("peek").expect("kept");
        assert!(
            matches!(&record.state, State::Completed { response } if &response[..] == b"done"),
            "{} is completed with its response: {:?}",
            lease.id,
            record.state
        );
    }
}
