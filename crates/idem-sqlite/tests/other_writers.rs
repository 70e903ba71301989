//! The writer remembers the records it has just claimed, so a completion
//! need not read its row again. What is committed in between must win over
//! that memory: here a claimed record is deleted (by a second store on the
//! same file, or by the same store) and another key is claimed, which takes
//! the deleted row's rowid. A completion that trusted the memory would
//! write the first key's record over the second's row.
//!
//! The writer also knows when the file remembers no expired key, and then
//! does not look there; a purge by a second store fills that memory, and
//! the first store's next claim must look again.

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease, PurgeExpired};
use idem::{DeleteRecord, Fingerprint, GetRecord, RecordId, State, Store, StoreError};
use idem_sqlite::SqliteStore;

const RETENTION: Duration = Duration::from_secs(3600);

async fn acquire(store: &SqliteStore, id: &RecordId) -> Lease {
    let params = ClaimParams::new(Duration::from_secs(30), RETENTION);
    match store.claim(id, &params).await.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("{id} was not acquired: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_sees_what_another_connection_committed_after_the_claim() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("idem.db");
    let first = SqliteStore::open(&path).expect("open");
    let second = SqliteStore::open(&path).expect("open again");
    stale_completion_is_refused(&first, &second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_sees_a_delete_by_its_own_store_after_the_claim() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    stale_completion_is_refused(&store, &store).await;
}

/// `first` claims a key, `second` deletes its record and claims another
/// key; `first`'s completion must be refused and leave the other alone.
async fn stale_completion_is_refused(first: &SqliteStore, second: &SqliteStore) {
    let deleted = RecordId::parse("orders", "deleted").expect("valid");
    let other = RecordId::parse("orders", "other").expect("valid");

    let stale = acquire(first, &deleted).await;
    assert!(second.delete(&deleted).await.expect("delete"));
    let live = acquire(second, &other).await;

    let late = first
        .complete(&stale, Bytes::from_static(b"first"), RETENTION)
        .await;
    assert!(
        matches!(late, Err(StoreError::LeaseLost)),
        "a completion of a deleted record: {late:?}"
    );
    let record = first
        .get(&other)
        .await
        .expect("get")
        .expect("other's record");
    assert!(
        matches!(record.state, State::InProgress { token, .. } if token == live.token),
        "the other key's record after the stale completion: {record:?}"
    );
    assert_eq!(first.get(&deleted).await.expect("get"), None);

    second
        .complete(&live, Bytes::from_static(b"second"), RETENTION)
        .await
        .expect("complete");
    let record = first
        .get(&other)
        .await
        .expect("get")
        .expect("other's record");
    assert_eq!(
        record.state,
        State::Completed {
            response: Bytes::from_static(b"second")
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_and_a_completion_follow_the_claims_own_writes() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open");
    let id = RecordId::parse("orders", "beat").expect("valid");
    let lease = acquire(&store, &id).await;
    let until = store
        .extend(&lease, Duration::from_secs(120))
        .await
        .expect("extend");
    let record = store.get(&id).await.expect("get").expect("record");
    assert_eq!(
        record.state,
        State::InProgress {
            token: lease.token,
            lease_until: until
        }
    );
    store
        .complete(&lease, Bytes::from_static(b"done"), RETENTION)
        .await
        .expect("complete");
    assert!(matches!(
        store.extend(&lease, Duration::from_secs(1)).await,
        Err(StoreError::LeaseLost)
    ));
    let record = store.get(&id).await.expect("get").expect("record");
    assert!(record.expires_at >= until, "{record:?}");
    assert_eq!(
        record.state,
        State::Completed {
            response: Bytes::from_static(b"done")
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_is_forgotten_after_another_store_purged_its_key() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let path = dir.path().join("idem.db");
    let first = SqliteStore::builder(&path)
        .remember_expired(Duration::from_secs(7 * 86_400))
        .open()
        .expect("open");
    // The setting is the file's: the second store remembers too.
    let second = SqliteStore::open(&path).expect("open again");
    let id = RecordId::parse("orders", "paid").expect("valid");
    let brief = Duration::from_millis(50);
    let params = ClaimParams::new(Duration::from_secs(30), brief)
        .fingerprint(Fingerprint::of_bytes(b"charge 10"));

    // The first claim finds the memory empty, and the writer knows it.
    let lease = match first.claim(&id, &params).await.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("not acquired: {other:?}"),
    };
    first
        .complete(&lease, Bytes::from_static(b"done"), brief)
        .await
        .expect("complete");
    tokio::time::sleep(brief * 3).await;
    assert_eq!(second.purge_expired(100).await.expect("purge"), 1);
    assert_eq!(first.remembered().await.expect("remembered"), 1);

    let retry = first.claim(&id, &params).await.expect("claim again");
    assert!(
        matches!(retry, ClaimOutcome::Forgotten { .. }),
        "a late retry after another store's purge: {retry:?}"
    );
}
