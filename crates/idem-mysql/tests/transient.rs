//! MySQL's transient errors (docs/design.md §5.5): a lock wait timeout or
//! a deadlock is "try again", never a definite refusal. A batch the server
//! rolls back is run again item by item, so one locked record never fails
//! its neighbours; a run whose completion meets a lock held for a while is
//! retried within its lease and stored; a server that crashes answers
//! "unavailable" and, restarted, has lost nothing it acknowledged.
//!
//! This binary's server gives up on a row lock after one second
//! (`innodb_lock_wait_timeout`, the shortest MySQL has).

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{GetRecord, Idempotency, RecordId, Store, StoreError};
use idem_mysql::MySqlStore;
use idem_testkit::servers::mysql::MySqlServer;
use mysql_async::prelude::Queryable;

/// A store in a database of its own, on the binary's server with a lock
/// wait timeout of one second; its URL.
async fn store(batching: bool) -> (MySqlStore, String) {
    common::server()
        .admin("", "SET GLOBAL innodb_lock_wait_timeout = 1")
        .expect("lock wait timeout");
    let url = common::url("transient");
    let store = MySqlStore::builder(&url)
        .expect("valid URL")
        .pool_size(4)
        .batching(batching)
        .connect()
        .await
        .expect("connect");
    (store, url)
}

/// A session of its own that locks the row of `key` until `hold` has
/// passed; resolves once the lock is taken.
async fn lock_row(url: &str, key: &str, hold: Duration) -> tokio::task::JoinHandle<()> {
    let pool = mysql_async::Pool::new(url);
    let mut conn = pool.get_conn().await.expect("connect");
    let (locked, taken) = tokio::sync::oneshot::channel();
    let key = key.to_owned();
    let holder = tokio::spawn(async move {
        conn.query_drop("START TRANSACTION").await.expect("begin");
        let rows: Vec<i64> = conn
            .exec(
                "SELECT 1 FROM idem_records WHERE scope = 'transient' AND `key` = ? FOR UPDATE",
                (key.as_bytes(),),
            )
            .await
            .expect("lock");
        assert_eq!(rows.len(), 1, "the row exists");
        let _ = locked.send(());
        tokio::time::sleep(hold).await;
        conn.query_drop("COMMIT").await.expect("commit");
        drop(conn);
        pool.disconnect().await.expect("disconnect");
    });
    taken.await.expect("locked");
    holder
}

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

async fn claim_all(store: &MySqlStore, keys: &[RecordId]) -> Vec<Lease> {
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
async fn lock_wait_timeouts_are_unavailable_not_refusals() {
    let (store, url) = store(false).await;
    let id = RecordId::parse("transient", "single").expect("id");
    let lease = claim_all(&store, std::slice::from_ref(&id)).await.remove(0);
    let holder = lock_row(&url, "single", Duration::from_secs(3)).await;
    let done = store
        .complete(&lease, "ok".into(), Duration::from_secs(3600))
        .await;
    assert!(unavailable(&done), "{done:?}");
    assert!(
        matches!(&done, Err(e) if e.is_contention()),
        "a lock wait is contention: {done:?}"
    );
    let claimed = store.claim(&id, &params()).await;
    assert!(unavailable(&claimed), "{claimed:?}");
    holder.await.expect("holder");
    // Nothing was applied: the lease still completes.
    store
        .complete(&lease, "ok".into(), Duration::from_secs(3600))
        .await
        .expect("completed once the lock is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_record_fails_only_its_own_item_of_a_batch() {
    let (store, url) = store(true).await;
    let ids: Vec<RecordId> = (0..40)
        .map(|i| RecordId::parse("transient", &format!("k{i:02}")).expect("id"))
        .collect();
    let leases = claim_all(&store, &ids).await;
    let holder = lock_row(&url, "k20", Duration::from_secs(8)).await;
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
        // What the batch answered is what the server kept: a completion
        // answered Ok was not rolled back with the batch.
        let stored = store.get(&lease.id).await.expect("get").expect("live");
        assert_eq!(
            matches!(stored.state, idem::State::Completed { .. }),
            result.is_ok(),
            "{}: answered {result:?}, stored {:?}",
            lease.id.key().as_str(),
            stored.state
        );
    }
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
    let (store, url) = store(true).await;
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(15))
        .build()
        .expect("executor");
    let id = RecordId::parse("transient", "run").expect("id");
    let mut holder = None;
    let receipt = idem
        .run(&id, None, |_ctx| {
            let url = url.clone();
            let holder = &mut holder;
            async move {
                // While the handler finishes, another session holds the
                // record's row for 2.5 s: the completion times out on the
                // lock, more than once.
                *holder = Some(lock_row(&url, "run", Duration::from_millis(2500)).await);
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
/// same record is transient, but not "the store is down": even with
/// fail-open, the handler does not run unguarded beside the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contended_claim_never_fails_open() {
    let (store, url) = store(false).await;
    let id = RecordId::parse("transient", "open").expect("id");
    let lease = claim_all(&store, std::slice::from_ref(&id)).await.remove(0);
    store.release(&lease).await.expect("released");
    let idem = Idempotency::builder(store.clone())
        .fail_open(true)
        .build()
        .expect("executor");
    let holder = lock_row(&url, "open", Duration::from_secs(3)).await;
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

/// A server that crashes (SIGKILL) answers "unavailable", never a
/// refusal; restarted, it has every record it acknowledged, and fences
/// keep rising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_is_unavailable_and_loses_nothing_it_acknowledged() {
    let mut server = tokio::task::spawn_blocking(MySqlServer::start)
        .await
        .expect("join")
        .expect("start mariadb");
    let db = server.create_database("crash").expect("database");
    let store = MySqlStore::builder(&server.url(&db))
        .expect("valid URL")
        .pool_size(2)
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    let done = RecordId::parse("crash", "done").expect("id");
    let held = RecordId::parse("crash", "held").expect("id");
    let lease = claim_all(&store, std::slice::from_ref(&done))
        .await
        .remove(0);
    store
        .complete(&lease, "kept".into(), Duration::from_secs(3600))
        .await
        .expect("completed");
    let short = ClaimParams::new(Duration::from_millis(500), Duration::from_secs(3600));
    let Ok(ClaimOutcome::Acquired(first)) = store.claim(&held, &short).await else {
        panic!("claim");
    };

    server.crash();
    let down = store.claim(&done, &params()).await;
    assert!(unavailable(&down), "{down:?}");
    server = tokio::task::spawn_blocking(move || {
        server.start_again().expect("restart");
        server
    })
    .await
    .expect("join");

    let mut again = store.claim(&done, &params()).await;
    for _ in 0..20 {
        if !unavailable(&again) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        again = store.claim(&done, &params()).await;
    }
    assert!(
        matches!(&again, Ok(ClaimOutcome::Completed(r)) if r.as_ref() == b"kept"),
        "{again:?}"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    match store.claim(&held, &params()).await {
        Ok(ClaimOutcome::Acquired(second)) => {
            assert!(second.takeover, "taken over after the lease ran out");
            assert!(
                second.fence > first.fence,
                "{} > {}",
                second.fence,
                first.fence
            );
        }
        other => panic!("{other:?}"),
    }
    drop(server);
}

/// A server turned read-only, as a primary demoted by a failover is,
/// answers writes with 1290 (`--read-only`): transient, never a refusal
/// that would end a run; writable again, the same store writes. The user
/// is not root: MariaDB lets a user with `READ_ONLY ADMIN` write anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_unavailable_not_a_refusal() {
    let server = common::server();
    let db = server.create_database("readonly").expect("database");
    server
        .admin(
            "",
            &format!(
                "CREATE USER IF NOT EXISTS 'app'@'127.0.0.1'; \
                 GRANT ALL ON {db}.* TO 'app'@'127.0.0.1'"
            ),
        )
        .expect("user");
    let url = format!("mysql://app@127.0.0.1:{}/{db}", server.port());
    let store = MySqlStore::builder(&url)
        .expect("valid URL")
        .pool_size(2)
        .connect()
        .await
        .expect("connect as app");
    let before = RecordId::parse("readonly", "before").expect("id");
    claim_all(&store, std::slice::from_ref(&before)).await;

    server
        .admin("", "SET GLOBAL read_only = 1")
        .expect("read-only");
    let during = RecordId::parse("readonly", "during").expect("id");
    let refused = store.claim(&during, &params()).await;
    server
        .admin("", "SET GLOBAL read_only = 0")
        .expect("writable");
    assert!(unavailable(&refused), "{refused:?}");
    let text = idem::error_chain(&refused.expect_err("refused"));
    assert!(text.contains("read-only"), "{text}");

    let after = store.claim(&during, &params()).await;
    assert!(
        matches!(after, Ok(ClaimOutcome::Acquired(_))),
        "writable again: {after:?}"
    );
}
