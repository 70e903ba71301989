//! Claimers racing on one key and on many: exactly one wins each key.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem::RecordId;

use idem::store::{ClaimOutcome, ClaimParams, Lease};
use tokio::sync::Barrier;

use super::{acquire, id, params, Core, Fixture, LONG};

/// 64 concurrent claimers on one key: exactly one acquires.
pub async fn concurrent_claimers_on_one_key<S: Core>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let winners = race_claims(f, &id).await;
    assert_eq!(
        winners.len(),
        1,
        "exactly one of 64 concurrent claimers must acquire"
    );
}

/// 64 claimers claim `id` at once (a long lease, so no takeover among
/// them); returns the leases of those that acquired. Every other claimer
/// must have been told the record is in progress.
async fn race_claims<S: Core>(f: &Fixture<S>, id: &RecordId) -> Vec<Lease> {
    let p = ClaimParams::new(Duration::from_secs(60), LONG);
    let barrier = Arc::new(Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, id, p, barrier) = (
                Arc::clone(&f.store),
                id.clone(),
                p.clone(),
                Arc::clone(&barrier),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&id, &p).await.expect("claim succeeds")
            })
        })
        .collect();
    let mut acquired = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            ClaimOutcome::Acquired(lease) => acquired.push(lease),
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    acquired
}

/// 64 concurrent claimers on a record whose lease ran out, and on a
/// released record: exactly one acquires each (the read-then-write race a
/// unique constraint alone does not prevent).
pub async fn concurrent_claimers_on_expired_and_released_records<S: Core>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    let expired = id(&scope, "expired");
    let released = id(&scope, "released");
    acquire(f, &expired, &p).await;
    let lease = acquire(f, &released, &p).await;
    f.store.release(&lease).await.expect("release");
    f.advance(f.lease).await;
    for target in [expired, released] {
        let winners = race_claims(f, &target).await;
        assert_eq!(
            winners.len(),
            1,
            "exactly one of 64 claimers may acquire {target}"
        );
        assert_eq!(winners[0].attempt, 2, "{target} is reacquired as attempt 2");
    }
}

/// 64 concurrent claimers over 1,000 keys: exactly 1,000 acquisitions,
/// one per key.
pub async fn concurrent_claimers_on_many_keys<S: Core>(f: &Fixture<S>) {
    const KEYS: usize = 1000;
    let scope = f.scope("s");
    let ids: Arc<Vec<RecordId>> =
        Arc::new((0..KEYS).map(|i| id(&scope, &format!("k{i}"))).collect());
    let p = ClaimParams::new(Duration::from_secs(60), LONG);
    let barrier = Arc::new(Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (store, ids, p, barrier) = (
                Arc::clone(&f.store),
                Arc::clone(&ids),
                p.clone(),
                Arc::clone(&barrier),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let mut won = Vec::new();
                for i in 0..KEYS {
                    let index = (i + t * 37) % KEYS;
                    if let ClaimOutcome::Acquired(_) =
                        store.claim(&ids[index], &p).await.expect("claim succeeds")
                    {
                        won.push(index);
                    }
                }
                won
            })
        })
        .collect();
    let mut per_key: HashMap<usize, usize> = HashMap::new();
    for task in tasks {
        for index in task.await.expect("task") {
            *per_key.entry(index).or_default() += 1;
        }
    }
    let total: usize = per_key.values().sum();
    let doubled: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "keys acquired more than once: {doubled:?}"
    );
    assert_eq!(total, KEYS, "every key must be acquired exactly once");
}
