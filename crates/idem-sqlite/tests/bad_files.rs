//! Files that cannot be used get clear, typed errors — never a panic,
//! never a guess.

use std::time::Duration;

use idem::{ClaimOutcome, ClaimParams, GetRecord, RecordId, Store, StoreError};
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
