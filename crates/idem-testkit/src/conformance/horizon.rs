//! The memory of expired keys ([`idem::horizon`]), for stores that
//! remember: a late retry of a completed or failed key is answered
//! `Forgotten` before and after the purge, never acquired; another request
//! under the old key runs; released records are not remembered; deleting
//! an expired record leaves it to the purge (which remembers); and (on
//! a manual clock, group `horizon_days`) the memory ends a whole day at a
//! time. The fixture's store must remember for [`MEMORY`]. On a manual
//! clock records are kept a day; on a server's clock, the fixture's short
//! lease.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::horizon::DAY_MS;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Failure, FailureClass, Fingerprint, Timestamp};

use super::{acquire, claim, id, Admin, Fixture};

/// How long the fixture's store must remember expired keys.
pub const MEMORY: Duration = Duration::from_secs(7 * 86_400);

const DAY: Duration = Duration::from_secs(86_400);

/// How long the cases keep records: a day on a manual clock, the short
/// lease on a server's.
fn retention<S: idem::Store>(f: &Fixture<S>) -> Duration {
    if f.is_manual() {
        DAY
    } else {
        f.lease
    }
}

fn params<S: idem::Store>(f: &Fixture<S>, fingerprint: &[u8]) -> ClaimParams {
    ClaimParams::new(f.lease, retention(f)).fingerprint(Fingerprint::of_bytes(fingerprint))
}

/// Acquires `key` and completes it, kept for the cases' retention.
async fn completed<S: Admin>(f: &Fixture<S>, key: &idem::RecordId, p: &ClaimParams) {
    let lease = acquire(f, key, p).await;
    f.store
        .complete(&lease, Bytes::from_static(b"done"), retention(f))
        .await
        .expect("complete");
}

/// Moves time past the records' expiry.
async fn expire<S: idem::Store>(f: &Fixture<S>) {
    f.advance(retention(f) + Duration::from_secs(1)).await;
}

async fn purge_all<S: Admin>(f: &Fixture<S>) {
    while f.store.purge_expired(1000).await.expect("purge") > 0 {}
}

fn day_start(at: Timestamp) -> Timestamp {
    Timestamp::from_millis(at.as_millis() / DAY_MS * DAY_MS)
}

/// A retry of a completed key after its record expired is `Forgotten`
/// (naming the expiry) both while the expired record is still held and
/// after the purge deleted it (naming the day); it writes nothing; the
/// same key with another fingerprint is a new request and is acquired,
/// and while that record is live the old request meets it (`Mismatch`).
pub async fn a_late_retry_is_forgotten_before_and_after_the_purge<S: Admin>(f: &Fixture<S>) {
    let key = id(&f.scope("s"), "paid");
    let (same, other) = (params(f, b"charge 10"), params(f, b"charge 20"));
    let lease = acquire(f, &key, &same).await;
    f.store
        .complete(&lease, Bytes::from_static(b"done"), retention(f))
        .await
        .expect("complete");
    let expires_at = f
        .store
        .get(&key)
        .await
        .expect("get")
        .expect("held")
        .expires_at;
    expire(f).await;
    assert_eq!(
        claim(f, &key, &same).await,
        ClaimOutcome::Forgotten {
            expired_at: expires_at
        },
        "an expired record not yet purged is remembered"
    );
    assert!(
        f.store.get(&key).await.expect("get").is_none(),
        "a forgotten answer writes nothing"
    );
    assert!(
        !f.store.delete(&key).await.expect("delete"),
        "an expired record is not live"
    );
    assert!(
        matches!(claim(f, &key, &same).await, ClaimOutcome::Forgotten { .. }),
        "deleting an expired record does not forget its key"
    );
    purge_all(f).await;
    for _ in 0..2 {
        assert_eq!(
            claim(f, &key, &same).await,
            ClaimOutcome::Forgotten {
                expired_at: day_start(expires_at)
            },
            "a purged record is remembered to the day"
        );
    }
    match claim(f, &key, &other).await {
        ClaimOutcome::Acquired(lease) => assert_eq!(lease.attempt, 1, "a new record"),
        found => panic!("another request under an old key runs, got {found:?}"),
    }
    assert_eq!(
        claim(f, &key, &same).await,
        ClaimOutcome::Mismatch,
        "while the key's new record is live, the old request meets it, not the memory"
    );
}

/// Failed records are remembered like completed ones; released records
/// (which never ended) are not: their retry runs.
pub async fn failed_keys_are_remembered_and_released_ones_are_not<S: Admin>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let (failed, released) = (id(&scope, "declined"), id(&scope, "released"));
    let p = params(f, b"request");
    let lease = acquire(f, &failed, &p).await;
    f.store
        .fail(
            &lease,
            Failure::new(FailureClass::Terminal, "declined"),
            retention(f),
        )
        .await
        .expect("fail");
    let lease = acquire(f, &released, &p).await;
    f.store.release(&lease).await.expect("release");
    expire(f).await;
    purge_all(f).await;
    assert!(
        matches!(claim(f, &failed, &p).await, ClaimOutcome::Forgotten { .. }),
        "a failed key is remembered"
    );
    match claim(f, &released, &p).await {
        ClaimOutcome::Acquired(_) => {}
        found => panic!("a released key is not remembered, got {found:?}"),
    }
}

/// What is remembered is dropped a day at a time once older than the
/// memory: a retry after that runs again.
pub async fn the_memory_ends_whole_days_after_it<S: Admin>(f: &Fixture<S>) {
    assert!(
        f.is_manual(),
        "this case moves time by days: give it a store on a manual clock"
    );
    let key = id(&f.scope("s"), "old");
    let p = params(f, b"request");
    let lease = acquire(f, &key, &p).await;
    f.store
        .complete(&lease, Bytes::from_static(b"done"), DAY)
        .await
        .expect("complete");
    f.advance(DAY * 2).await;
    purge_all(f).await;
    f.advance(MEMORY - DAY * 2).await;
    purge_all(f).await;
    assert!(
        matches!(claim(f, &key, &p).await, ClaimOutcome::Forgotten { .. }),
        "still remembered within the memory"
    );
    f.advance(DAY * 2).await;
    purge_all(f).await;
    match claim(f, &key, &p).await {
        ClaimOutcome::Acquired(lease) => assert_eq!(lease.attempt, 1),
        found => panic!("beyond the memory the key runs again, got {found:?}"),
    }
}

/// The outbox's own records (its registry and markers, claimed again by
/// design) are never remembered.
pub async fn the_outboxs_own_records_are_never_remembered<S: Admin>(f: &Fixture<S>) {
    let unique = format!("{:016x}", rand::random::<u64>());
    let p = params(f, b"marker");
    // Claimed again once expired, whether or not the purge ran between.
    for (suffix, purged) in [("", false), ("-purged", true)] {
        let ids = ["idem.outbox", "idem.outbox/00ff00ff"].map(|scope| {
            idem::RecordId::parse(scope, &format!("{unique}{suffix}")).expect("a valid id")
        });
        for key in &ids {
            completed(f, key, &p).await;
        }
        expire(f).await;
        if purged {
            purge_all(f).await;
        }
        for key in &ids {
            match claim(f, key, &p).await {
                ClaimOutcome::Acquired(_) => {}
                found => {
                    panic!("{key} is claimed again after expiry (purged: {purged}), got {found:?}")
                }
            }
        }
    }
}

/// Many concurrent late retries of a remembered key: every one is
/// `Forgotten`, none acquires.
pub async fn concurrent_late_retries_never_run<S: Admin>(f: &Fixture<S>) {
    let key = id(&f.scope("s"), "racing");
    let p = params(f, b"request");
    completed(f, &key, &p).await;
    expire(f).await;
    purge_all(f).await;
    let store = Arc::clone(&f.store);
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (store, key, p) = (Arc::clone(&store), key.clone(), p.clone());
            tokio::spawn(async move { store.claim(&key, &p).await.expect("claim") })
        })
        .collect();
    for task in tasks {
        let found = task.await.expect("task");
        assert!(
            matches!(found, ClaimOutcome::Forgotten { .. }),
            "a late retry never runs, got {found:?}"
        );
    }
}
