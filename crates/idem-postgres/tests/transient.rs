//! PostgreSQL's transient errors (docs/design.md §5.5): a lock or statement
//! timeout is "try again", never a definite refusal. A batch statement the
//! server rolls back is run again item by item, so one locked record never
//! fails its neighbours; and a run whose completion meets a lock held for a
//! while is retried within its lease and stored, not ended as a terminal
//! failure.

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{Idempotency, RecordId, Store, StoreError};
use idem_postgres::PgStore;
use idem_testkit::servers::postgres::PgServer;
use tokio_postgres::NoTls;

/// A store in a schema of its own whose sessions give up on a row lock
/// after 200 ms (`lock_timeout`) or on a statement after 300 ms
/// (`statement_timeout`), by the connection URL's `options`.
async fn store(setting: &str, batching: bool) -> (PgStore, String) {
    let schema = format!("transient_{:016x}", rand::random::<u64>());
    let url = format!(
        "{}?options=-c%20{}",
        common::url(),
        setting.replace('=', "%3D")
    );
    let store = PgStore::builder(&url)
        .expect("valid URL")
        .schema(schema.clone())
        .pool_size(4)
        .batching(batching)
        .connect()
        .await
        .expect("connect");
    (store, schema)
}

/// A session of its own that locks the row of `key` in `schema` until
/// `hold` has passed; resolves once the lock is taken.
async fn lock_row(schema: &str, key: &str, hold: Duration) -> tokio::task::JoinHandle<()> {
    let (client, connection) = tokio_postgres::connect(&common::url(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let (locked, taken) = tokio::sync::oneshot::channel();
    let sql = format!("SELECT 1 FROM {schema}.idem_records WHERE key = $1 FOR UPDATE");
    let key = key.to_owned();
    let holder = tokio::spawn(async move {
        client.batch_execute("BEGIN").await.expect("begin");
        let rows = client.query(&sql, &[&key]).await.expect("lock");
        assert_eq!(rows.len(), 1, "the row exists");
        let _ = locked.send(());
        tokio::time::sleep(hold).await;
        client.batch_execute("COMMIT").await.expect("commit");
    });
    taken.await.expect("locked");
    holder
}

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

async fn claim_all(store: &PgStore, keys: &[RecordId]) -> Vec<Lease> {
    let params = params();
    join_all(keys.iter().map(|id| store.claim(id, &params)))
        .await
        .into_iter()
        .map(|c| match c {
            Ok(ClaimOutcome::Acquired(lease)) => lease,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn unavailable<T: std::fmt::Debug>(result: &Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::Unavailable(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_statement_timeouts_are_unavailable_not_refusals() {
    for setting in ["lock_timeout=200ms", "statement_timeout=300ms"] {
        let (store, schema) = store(setting, false).await;
        let id = RecordId::parse("transient", "single").expect("id");
        let lease = claim_all(&store, std::slice::from_ref(&id)).await.remove(0);
        let holder = lock_row(&schema, "single", Duration::from_secs(2)).await;
        let done = store
            .complete(&lease, "ok".into(), Duration::from_secs(3600))
            .await;
        assert!(unavailable(&done), "{setting}: {done:?}");
        let claimed = store.claim(&id, &params()).await;
        assert!(unavailable(&claimed), "{setting}: {claimed:?}");
        holder.await.expect("holder");
        // Nothing was applied: the lease still completes.
        store
            .complete(&lease, "ok".into(), Duration::from_secs(3600))
            .await
            .expect("completed once the lock is gone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_record_fails_only_its_own_item_of_a_batch() {
    let (store, schema) = store("lock_timeout=200ms", true).await;
    let ids: Vec<RecordId> = (0..40)
        .map(|i| RecordId::parse("transient", &format!("k{i:02}")).expect("id"))
        .collect();
    let leases = claim_all(&store, &ids).await;
    let holder = lock_row(&schema, "k20", Duration::from_secs(3)).await;
    let done = join_all(
        leases
            .iter()
            .map(|l| store.complete(l, "ok".into(), Duration::from_secs(3600))),
    )
    .await;
    for (lease, result) in leases.iter().zip(&done) {
        if lease.id.key().as_str() == "k20" {
            assert!(unavailable(result), "the locked one: {result:?}");
        } else {
            assert!(result.is_ok(), "{}: {result:?}", lease.id.key().as_str());
        }
    }
    // Claims too: the locked record's claim waits and gives up alone.
    let more: Vec<RecordId> = (0..40)
        .map(|i| RecordId::parse("transient", &format!("m{i:02}")).expect("id"))
        .chain(std::iter::once(ids[20].clone()))
        .collect();
    let params = params();
    let claims = join_all(more.iter().map(|id| store.claim(id, &params))).await;
    for (id, result) in more.iter().zip(&claims) {
        if id.key().as_str() == "k20" {
            assert!(unavailable(result), "the locked one: {result:?}");
        } else {
            assert!(
                matches!(result, Ok(ClaimOutcome::Acquired(_))),
                "{}: {result:?}",
                id.key().as_str()
            );
        }
    }
    holder.await.expect("holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_meets_a_held_lock_is_retried_and_stored_not_failed() {
    let (store, schema) = store("lock_timeout=200ms", true).await;
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(10))
        .build()
        .expect("executor");
    let id = RecordId::parse("transient", "run").expect("id");
    let mut holder = None;
    let receipt = idem
        .run(&id, None, |_ctx| {
            let schema = schema.clone();
            let holder = &mut holder;
            async move {
                // While the handler finishes, another session holds the
                // record's row for 800 ms: the completion times out on
                // the lock, more than once.
                *holder = Some(lock_row(&schema, "run", Duration::from_millis(800)).await);
                Ok::<_, std::io::Error>("charged".to_owned())
            }
        })
        .await
        .expect("stored, not failed");
    assert!(!receipt.is_replayed());
    assert_eq!(receipt.value(), "charged");
    holder.take().expect("locked").await.expect("holder");
    let again = idem
        .run(&id, None, |_ctx| async {
            Ok::<_, std::io::Error>("ran twice".to_owned())
        })
        .await
        .expect("replayed");
    assert!(again.is_replayed());
    assert_eq!(again.value(), "charged");
}

/// A claim that gives up on a lock held by another session's write to the
/// same record (most likely a duplicate of this very request) is
/// transient, but not "the store is down": even with fail-open, the
/// handler does not run unguarded beside the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_claim_never_fails_open() {
    let (store, schema) = store("lock_timeout=200ms", false).await;
    let id = RecordId::parse("transient", "open").expect("id");
    let lease = claim_all(&store, std::slice::from_ref(&id)).await.remove(0);
    store
        .release(&lease)
        .await
        .expect("released: claimable again");
    let idem = Idempotency::builder(store.clone())
        .fail_open(true)
        .build()
        .expect("executor");
    let holder = lock_row(&schema, "open", Duration::from_secs(2)).await;
    let ran = std::sync::atomic::AtomicBool::new(false);
    let result = idem
        .run(&id, None, |_ctx| async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>("ran".to_owned())
        })
        .await;
    assert!(
        matches!(&result, Err(idem::RunError::Store(e)) if e.is_contention()),
        "{result:?}"
    );
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "ran unguarded"
    );
    holder.await.expect("holder");
}

/// A failover that demotes the primary while the pool's connections stay
/// up answers their writes with 25006 `read_only_sql_transaction`: a
/// transient error, and the pool then drops every connection made before
/// it, so the next write reaches the writable server behind the same
/// address instead of failing on the standby for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_a_demoted_primary_are_dropped_and_the_next_write_lands() {
    // A server of its own: the demotion is a server-wide setting.
    let server = tokio::task::spawn_blocking(PgServer::start)
        .await
        .expect("join")
        .expect("start postgres");
    let db = server.create_database("demoted").expect("database");
    let url = server.url(&db);
    let store = PgStore::builder(&url)
        .expect("valid URL")
        .pool_size(3)
        .connect()
        .await
        .expect("connect");
    let ids: Vec<RecordId> = (0..3)
        .map(|i| RecordId::parse("demoted", &format!("before-{i}")).expect("id"))
        .collect();
    // The pool's connections are open.
    claim_all(&store, &ids).await;

    // The sessions open now turn read-only, as on a demoted primary;
    // sessions opened from now on are writable (the role's setting wins
    // over the server's), as on the new primary behind the same address.
    let (admin, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    // One statement at a time: ALTER SYSTEM refuses a transaction block.
    for sql in [
        "ALTER ROLE postgres SET default_transaction_read_only = off",
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql).await.expect(sql);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let first = store
        .claim(
            &RecordId::parse("demoted", "after-0").expect("id"),
            &params(),
        )
        .await;
    assert!(
        unavailable(&first),
        "a standby's refusal is transient: {first:?}"
    );
    let text = idem::error_chain(&first.expect_err("refused"));
    assert!(text.contains("read-only"), "{text}");

    for i in 1..4 {
        let id = RecordId::parse("demoted", &format!("after-{i}")).expect("id");
        let claimed = store.claim(&id, &params()).await;
        assert!(
            matches!(claimed, Ok(ClaimOutcome::Acquired(_))),
            "claim {i} after the demotion was seen: {claimed:?}"
        );
    }
}
