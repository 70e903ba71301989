//! After a run of new keys a claim skips its read and goes straight to the
//! writer; the answers for keys that are there must not change: a
//! duplicate of a run in progress, a completed key's outcome and a
//! mismatched fingerprint, each in turn after another run of new keys.
//! And while the writer cannot answer (another connection holds the write
//! lock), the read is made again, so stored outcomes are still replayed.

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{Fingerprint, RecordId, Store};
use idem_sqlite::SqliteStore;

fn params(body: &[u8]) -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
        .fingerprint(Fingerprint::of_bytes(body))
}

async fn acquire(store: &SqliteStore, id: &RecordId) -> Lease {
    match store.claim(id, &params(b"a")).await.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("{id} was not acquired: {other:?}"),
    }
}

/// Claims `id` and completes it with `paid`.
async fn completed(store: &SqliteStore, id: &RecordId) {
    let lease = acquire(store, id).await;
    store
        .complete(
            &lease,
            Bytes::from_static(b"paid"),
            Duration::from_secs(3600),
        )
        .await
        .expect("complete");
}

async fn new_keys(store: &SqliteStore, round: usize) {
    for n in 0..40 {
        let id = RecordId::parse("orders", &format!("new-{round}-{n}")).expect("valid");
        let outcome = store.claim(&id, &params(b"a")).await.expect("claim");
        assert!(matches!(outcome, ClaimOutcome::Acquired(_)), "{outcome:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_are_there_are_answered_alike_after_a_run_of_new_ones() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    let running = RecordId::parse("orders", "running").expect("valid");
    let done = RecordId::parse("orders", "done").expect("valid");
    acquire(&store, &running).await;
    completed(&store, &done).await;

    for round in 0..2 {
        new_keys(&store, round * 3).await;
        let outcome = store.claim(&running, &params(b"a")).await.expect("claim");
        assert!(
            matches!(outcome, ClaimOutcome::InProgress { .. }),
            "a duplicate of a run in progress: {outcome:?}"
        );
        new_keys(&store, round * 3 + 1).await;
        let outcome = store.claim(&done, &params(b"a")).await.expect("claim");
        assert!(
            matches!(&outcome, ClaimOutcome::Completed(response) if response == "paid"),
            "a completed key: {outcome:?}"
        );
        new_keys(&store, round * 3 + 2).await;
        let outcome = store.claim(&done, &params(b"b")).await.expect("claim");
        assert!(
            outcome == ClaimOutcome::Mismatch,
            "another request under a completed key: {outcome:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_writer_fails_the_read_answers_again() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("idem.db");
    let store = SqliteStore::builder(&path)
        .busy_timeout(Duration::from_millis(100))
        .open()
        .expect("open");
    let done = RecordId::parse("orders", "done").expect("valid");
    completed(&store, &done).await;
    new_keys(&store, 0).await;

    // Another connection takes the write lock and keeps it.
    let blocker = rusqlite::Connection::open(&path).expect("open a second connection");
    blocker
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the write lock");
    // After the run of new keys this claim skipped the read and met the
    // held lock; the next one reads first again and replays.
    let first = store.claim(&done, &params(b"a")).await;
    assert!(first.is_err(), "the writer could not answer: {first:?}");
    let again = store.claim(&done, &params(b"a")).await.expect("claim");
    assert!(
        matches!(&again, ClaimOutcome::Completed(response) if response == "paid"),
        "a completed key while the writer fails: {again:?}"
    );
    blocker.execute_batch("ROLLBACK").expect("release");
}
