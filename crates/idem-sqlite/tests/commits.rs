//! Concurrent writes share commits on any multi-threaded runtime. A write
//! that commits on its caller's thread must not keep the others from
//! queueing for the writer: on a runtime with one worker it did, and every
//! claim paid a commit (and an fsync) of its own.

use std::path::Path;
use std::time::Duration;

use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, Store};
use idem_sqlite::SqliteStore;

/// Frames in the file's write-ahead log, from its length and the page size
/// its header gives.
fn wal_frames(db: &Path) -> u64 {
    let wal = std::fs::read(db.with_extension("db-wal")).expect("the WAL");
    let page_size = u32::from_be_bytes(wal[8..12].try_into().expect("4 bytes"));
    (wal.len() as u64 - 32) / (24 + u64::from(page_size))
}

async fn claim(store: &SqliteStore, key: String) -> ClaimOutcome {
    let id = RecordId::parse("orders", &key).expect("valid");
    let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600));
    store.claim(&id, &params).await.expect("claim")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn concurrent_claims_on_one_worker_share_commits() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).expect("open");
    claim(&store, "first".to_owned()).await;
    let before = wal_frames(&path);
    let claims: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { claim(&store, format!("key-{i}")).await })
        })
        .collect();
    for claim in claims {
        let outcome = claim.await.expect("task");
        assert!(
            matches!(outcome, ClaimOutcome::Acquired { .. }),
            "{outcome:?}"
        );
    }
    // A claim writes a handful of pages (the row, its key, the expiry and
    // in-progress indexes): one commit each would log at least 4 frames a
    // claim; claims that share commits share their pages' frames.
    let frames = wal_frames(&path) - before;
    assert!(
        frames < 64,
        "64 concurrent claims wrote {frames} WAL frames: they did not share commits"
    );
}
