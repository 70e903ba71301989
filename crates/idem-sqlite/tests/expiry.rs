//! The purge finds expired records of every state. Records that ended
//! (completed, failed, released) are in the expiry index; claims are not
//! (migration 0005), and one abandoned past its retention is found
//! through the abandoned-claims index. Both with the memory of expired
//! keys and without, and in a file written before the migration.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease, PurgeExpired};
use idem::{Failure, FailureClass, ManualClock, RecordId, Store, Timestamp};
use idem_sqlite::{migrations, SqliteStore, SCHEMA_VERSION};
use rusqlite::Connection;

const LEASE: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_secs(60);
const LONG: Duration = Duration::from_secs(3600);

async fn acquire(store: &SqliteStore<ManualClock>, key: &str, retention: Duration) -> Lease {
    let id = RecordId::parse("s", key).expect("valid id");
    match store
        .claim(&id, &ClaimParams::new(LEASE, retention))
        .await
        .expect("claim")
    {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("{key} was not acquired: {other:?}"),
    }
}

/// The keys that have a row in the file, in order.
fn rows(path: &Path) -> Vec<String> {
    let conn = Connection::open(path).expect("open");
    let mut stmt = conn
        .prepare("SELECT key FROM idem_records ORDER BY key")
        .expect("prepare");
    stmt.query_map([], |r| r.get(0))
        .expect("query")
        .collect::<rusqlite::Result<_>>()
        .expect("rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_abandoned_past_its_retention_is_purged_beside_the_records_that_ended() {
    for memory in [None, Some(Duration::from_secs(86_400))] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
        let path = dir.path().join("idem.db");
        let clock = ManualClock::default();
        let builder = SqliteStore::builder(&path).clock(clock.clone());
        let store = match memory {
            Some(memory) => builder.remember_expired(memory),
            None => builder,
        }
        .open()
        .expect("open");
        let done = acquire(&store, "done", SHORT).await;
        store
            .complete(&done, Bytes::from_static(b"ok"), SHORT)
            .await
            .expect("complete");
        let failed = acquire(&store, "failed", SHORT).await;
        store
            .fail(&failed, Failure::new(FailureClass::Terminal, "no"), SHORT)
            .await
            .expect("fail");
        // A retryable failure releases the record: it ended no run.
        let released = acquire(&store, "released", SHORT).await;
        store
            .fail(
                &released,
                Failure::new(FailureClass::Retryable, "later"),
                SHORT,
            )
            .await
            .expect("release");
        acquire(&store, "abandoned", SHORT).await;
        // Its lease runs out, its retention does not.
        acquire(&store, "stale", LONG).await;
        let kept = acquire(&store, "kept", LONG).await;
        store
            .complete(&kept, Bytes::from_static(b"ok"), LONG)
            .await
            .expect("complete");
        clock.advance(SHORT + Duration::from_secs(1));

        // Bounded, the records that ended or were released first.
        assert_eq!(
            store.purge_expired(3).await.expect("purge"),
            3,
            "{memory:?}"
        );
        assert_eq!(rows(&path), ["abandoned", "kept", "stale"], "{memory:?}");
        assert_eq!(
            store.purge_expired(3).await.expect("purge"),
            1,
            "{memory:?}"
        );
        assert_eq!(
            store.purge_expired(10).await.expect("purge"),
            0,
            "{memory:?}"
        );
        assert_eq!(rows(&path), ["kept", "stale"], "{memory:?}");
        if memory.is_some() {
            // The completed and the failed keys; the released one and the
            // claim never ended.
            assert_eq!(store.remembered().await.expect("remembered"), 2);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_before_the_expiry_index_held_only_ended_records_is_upgraded() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("idem.db");
    let mut conn = Connection::open(&path).expect("create");
    let tx = conn.transaction().expect("begin");
    for m in migrations().iter().filter(|m| m.version <= 4) {
        tx.execute_batch(m.sql).expect(m.name);
    }
    tx.pragma_update(None, "user_version", 4).expect("version");
    // Expired (at 1 ms) and live (far ahead) records of both kinds, as an
    // older idem wrote them.
    let row = |key: &str, state: i64, expires: i64| {
        let (token, lease, response) = match state {
            0 => (Some(vec![7u8; 16]), Some(expires), None),
            _ => (None, None, Some(b"ok".to_vec())),
        };
        tx.execute(
            "INSERT INTO idem_records (scope, key, state, token, lease_until, response, \
             attempt, fence, created_at, updated_at, expires_at) \
             VALUES ('s', ?1, ?2, ?3, ?4, ?5, 1, 1, 0, 0, ?6)",
            rusqlite::params![key, state, token, lease, response, expires],
        )
        .expect("insert");
    };
    row("done", 1, 1);
    row("abandoned", 0, 1);
    row("live", 1, i64::MAX);
    row("running", 0, i64::MAX);
    tx.commit().expect("commit");
    drop(conn);

    let store = SqliteStore::builder(&path)
        .clock(ManualClock::new(Timestamp::from_millis(1_000)))
        .open()
        .expect("open and migrate");
    let conn = Connection::open(&path).expect("open");
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let index: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'idem_records_expires_at'",
            [],
            |r| r.get(0),
        )
        .expect("the expiry index");
    assert!(index.ends_with("WHERE state <> 0"), "{index}");
    assert_eq!(store.purge_expired(10).await.expect("purge"), 2);
    assert_eq!(rows(&path), ["live", "running"]);
}
