//! Files that cannot be used get clear, typed errors — never a panic,
//! never a guess.

use std::time::Duration;

use idem::{GetRecord, RecordId, Store, StoreError};

use idem::store::{ClaimOutcome, ClaimParams};
use idem_sqlite::{OpenError, SqliteStore, SCHEMA_VERSION};
use rusqlite::Connection;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temporary directory")
}

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

#[test]
fn a_path_that_cannot_be_created_is_unwritable() {
    let err = SqliteStore::open("/nonexistent-idem-dir/sub/idem.db").expect_err("cannot open");
    assert!(matches!(err, OpenError::Unwritable { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("/nonexistent-idem-dir/sub/idem.db"),
        "{err}"
    );
    let d = dir();
    let err = SqliteStore::open(d.path()).expect_err("a directory is not a file");
    assert!(matches!(err, OpenError::Unwritable { .. }), "{err:?}");
}

#[test]
fn a_file_that_is_not_a_database_is_refused_untouched() {
    let d = dir();
    let path = d.path().join("notes.txt");
    let text = "these are my notes, not a database\n".repeat(50);
    std::fs::write(&path, &text).expect("write");
    let err = SqliteStore::open(&path).expect_err("not a database");
    assert!(matches!(err, OpenError::NotADatabase { .. }), "{err:?}");
    assert!(
        err.to_string().contains("is not a SQLite database"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).expect("read"),
        text,
        "the file was left as it was"
    );
}

#[test]
fn a_database_from_a_future_schema_is_refused() {
    let d = dir();
    let path = d.path().join("idem.db");
    drop(SqliteStore::open(&path).expect("create"));
    Connection::open(&path)
        .and_then(|c| c.pragma_update(None, "user_version", 99))
        .expect("bump version");
    match SqliteStore::open(&path).expect_err("future schema") {
        OpenError::FutureSchema {
            found: 99,
            supported,
            ..
        } => assert_eq!(supported, SCHEMA_VERSION),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_locked_past_the_busy_timeout_is_reported_as_locked() {
    let d = dir();
    let path = d.path().join("idem.db");
    drop(SqliteStore::open(&path).expect("create"));
    let holder = Connection::open(&path).expect("open");
    holder.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    let err = SqliteStore::builder(&path)
        .busy_timeout(Duration::from_millis(100))
        .open()
        .expect_err("locked");
    assert!(matches!(err, OpenError::Locked { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("stayed locked by another connection"),
        "{err}"
    );
    holder.execute_batch("ROLLBACK").expect("unlock");
}

#[tokio::test]
async fn a_write_lock_held_elsewhere_makes_the_store_unavailable_not_wrong() {
    let d = dir();
    let path = d.path().join("idem.db");
    let store = SqliteStore::builder(&path)
        .busy_timeout(Duration::from_millis(100))
        .open()
        .expect("open");
    let id = RecordId::parse("s", "k").expect("valid");
    let holder = Connection::open(&path).expect("open");
    holder
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    let err = store.claim(&id, &params()).await.expect_err("locked out");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        err.is_contention(),
        "another writer holds the file: {err:?}"
    );
    // Not "the store is down": even with fail-open, nothing runs beside
    // the lock's holder (which may be running this very key).
    let idem = idem::Idempotency::builder(store.clone())
        .fail_open(true)
        .build()
        .expect("executor");
    let ran = std::sync::atomic::AtomicBool::new(false);
    let run = idem
        .run(&id, None, |_| async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        })
        .await;
    assert!(
        matches!(&run, Err(idem::RunError::Store(e)) if e.is_contention()),
        "{run:?}"
    );
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "ran unguarded"
    );
    holder.execute_batch("ROLLBACK").expect("release the lock");
    assert!(matches!(
        store.claim(&id, &params()).await,
        Ok(ClaimOutcome::Acquired(_))
    ));
}

#[tokio::test]
async fn a_corrupt_row_is_reported_and_never_overwritten() {
    let d = dir();
    let path = d.path().join("idem.db");
    let store = SqliteStore::open(&path).expect("open");
    let id = RecordId::parse("s", "bad").expect("valid");
    Connection::open(&path)
        .and_then(|c| {
            c.execute(
                "INSERT INTO idem_records (scope, key, state, attempt, fence, created_at, updated_at, expires_at) \
                 VALUES ('s', 'bad', 7, 1, 1, 0, 0, 9223372036854775807)",
                [],
            )
        })
        .expect("plant a bad row");
    for err in [
        store.get(&id).await.expect_err("corrupt"),
        store.claim(&id, &params()).await.expect_err("corrupt"),
    ] {
        match err {
            StoreError::Corrupt { id, reason } => {
                assert_eq!(id, "s/bad");
                assert_eq!(reason, "unknown state 7");
            }
            other => panic!("{other:?}"),
        }
    }
    let state: i64 = Connection::open(&path)
        .and_then(|c| {
            c.query_row(
                "SELECT state FROM idem_records WHERE key = 'bad'",
                [],
                |r| r.get(0),
            )
        })
        .expect("read");
    assert_eq!(
        state, 7,
        "a corrupt row is left for an operator, not overwritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_fails_in_sql_fails_alone_not_its_whole_batch() {
    let d = dir();
    let path = d.path().join("idem.db");
    let store = std::sync::Arc::new(SqliteStore::open(&path).expect("open"));
    let mut leases = Vec::new();
    for key in ["first", "poison"]
        .into_iter()
        .map(str::to_owned)
        .chain((0..20).map(|i| format!("k{i}")))
    {
        let id = RecordId::parse("s", &key).expect("valid");
        let ClaimOutcome::Acquired(lease) = store.claim(&id, &params()).await.expect("claim")
        else {
            panic!("fresh key");
        };
        leases.push(lease);
    }
    let raw = Connection::open(&path).expect("open");
    raw.execute_batch(
        "CREATE TRIGGER reject_poison BEFORE UPDATE ON idem_records WHEN NEW.key = 'poison' \
         BEGIN SELECT RAISE(ABORT, 'poisoned by the test'); END;",
    )
    .expect("trigger");
    // Hold the write lock so the completions queue up and share a batch.
    raw.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let complete = |lease: idem::store::Lease| {
        let store = std::sync::Arc::clone(&store);
        tokio::spawn(async move {
            store
                .complete(&lease, "done".into(), Duration::from_secs(3600))
                .await
        })
    };
    let mut leases = leases.into_iter();
    let first = complete(leases.next().expect("first"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rest: Vec<_> = leases
        .map(|l| (l.id.key().to_string(), complete(l)))
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    raw.execute_batch("ROLLBACK").expect("unlock");
    first.await.expect("task").expect("first completes");
    for (key, task) in rest {
        let result = task.await.expect("task");
        if key == "poison" {
            let err = result.expect_err("the poisoned write fails");
            assert!(err.to_string().contains("backend"), "{err}");
        } else {
            result.unwrap_or_else(|e| panic!("{key} failed with its batch: {e}"));
        }
    }
    let poisoned = store
        .get(&RecordId::parse("s", "poison").expect("valid"))
        .await
        .expect("get");
    assert!(
        matches!(
            poisoned.map(|r| r.state),
            Some(idem::State::InProgress { .. })
        ),
        "its write was rolled back"
    );
}

#[tokio::test]
async fn keys_longer_than_the_default_limit_are_listed() {
    use idem::{KeyRules, ListQuery, ListRecords, Scope};
    let d = dir();
    let store = SqliteStore::open(d.path().join("idem.db")).expect("open");
    let rules = KeyRules::default().max_len(std::num::NonZeroUsize::new(1024).expect("non-zero"));
    let id = RecordId::new(
        Scope::new("s").expect("valid"),
        rules.parse(&"k".repeat(300)).expect("valid under 1024"),
    );
    assert!(matches!(
        store.claim(&id, &params()).await,
        Ok(ClaimOutcome::Acquired(_))
    ));
    let page = store.list(&ListQuery::new(usize::MAX)).await.expect("list");
    assert_eq!(page.records.len(), 1);
    assert_eq!(page.records[0].0, id);
}
