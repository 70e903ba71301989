//! Batches: `claim_many` and `complete_many` answer each call as single
//! calls would, also racing single calls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Completion, Lease};
use idem::{Failure, FailureClass, Fingerprint, RecordId, StoreError};
use tokio::sync::Barrier;

use super::{acquire, assert_lease_lost, claim, id, params, Batches, Fixture, LONG};

/// `claim_many` answers each claim in order, as single claims would.
pub async fn batch_claims<S: Batches>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    let ids: Vec<RecordId> = (0..10).map(|i| id(&scope, &format!("k{i}"))).collect();
    acquire(f, &ids[3], &p).await;
    let done = acquire(f, &ids[5], &p).await;
    f.store
        .complete(&done, Bytes::from_static(b"five"), LONG)
        .await
        .expect("complete");

    let mut batch: Vec<(RecordId, ClaimParams)> =
        ids.iter().map(|id| (id.clone(), p.clone())).collect();
    batch.push((ids[0].clone(), p.clone()));
    let results = f.store.claim_many(&batch).await.expect("batch");
    assert_eq!(results.len(), 11, "one result per claim");
    for (i, result) in results.into_iter().enumerate() {
        let outcome = result.expect("each claim succeeds");
        match i {
            3 | 10 => assert!(
                matches!(outcome, ClaimOutcome::InProgress { .. }),
                "claim {i}: {outcome:?}"
            ),
            5 => assert_eq!(
                outcome,
                ClaimOutcome::Completed(Bytes::from_static(b"five"))
            ),
            _ => match outcome {
                ClaimOutcome::Acquired(lease) => assert_eq!(lease.id, ids[i]),
                other => panic!("claim {i} should acquire, got {other:?}"),
            },
        }
    }
}

/// Inside a batch every claim rule holds as for a single claim: an expired
/// lease is taken over, a released record is reclaimed, a record past its
/// retention starts anew, and finished or differently fingerprinted
/// records answer as they would alone.
pub async fn batch_claims_follow_every_claim_rule<S: Batches>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let a = params(f).fingerprint(Fingerprint::of_bytes(b"a"));
    let b = params(f).fingerprint(Fingerprint::of_bytes(b"b"));
    let [stale, released, expired, done, failed, mismatch, fresh] = [
        "stale", "released", "expired", "done", "failed", "mismatch", "fresh",
    ]
    .map(|k| id(&scope, k));
    let stale_lease = acquire(f, &stale, &a).await;
    let lease = acquire(f, &released, &a).await;
    f.store.release(&lease).await.expect("release");
    let lease = acquire(f, &expired, &a).await;
    let expired_fence = lease.fence;
    f.store
        .complete(&lease, Bytes::from_static(b"old"), f.lease)
        .await
        .expect("complete");
    for (target, response) in [(&done, "done"), (&mismatch, "kept")] {
        let lease = acquire(f, target, &a).await;
        f.store
            .complete(&lease, Bytes::from(response), LONG)
            .await
            .expect("complete");
    }
    let lease = acquire(f, &failed, &a).await;
    let refused = Failure::new(FailureClass::Terminal, "card refused");
    f.store
        .fail(&lease, refused.clone(), LONG)
        .await
        .expect("fail");
    f.advance(f.lease).await;

    let batch = vec![
        (fresh.clone(), a.clone()),
        (stale.clone(), a.clone()),
        (released.clone(), a.clone()),
        (expired.clone(), b.clone()),
        (done.clone(), a.clone()),
        (failed.clone(), a.clone()),
        (mismatch.clone(), b.clone()),
    ];
    let results = f.store.claim_many(&batch).await.expect("batch");
    let outcomes: Vec<ClaimOutcome> = results
        .into_iter()
        .map(|r| r.expect("each claim succeeds"))
        .collect();
    let lease_of = |i: usize| match &outcomes[i] {
        ClaimOutcome::Acquired(lease) => lease.clone(),
        other => panic!("claim of {} should acquire, got {other:?}", batch[i].0),
    };
    let fresh_lease = lease_of(0);
    assert_eq!((fresh_lease.attempt, fresh_lease.takeover), (1, false));
    let takeover = lease_of(1);
    assert!(
        takeover.takeover,
        "an expired lease in a batch is taken over"
    );
    assert_eq!(takeover.attempt, 2);
    assert!(takeover.fence > stale_lease.fence, "the fence rises");
    assert_ne!(takeover.token, stale_lease.token);
    let reclaimed = lease_of(2);
    assert_eq!((reclaimed.attempt, reclaimed.takeover), (2, false));
    let anew = lease_of(3);
    assert_eq!(
        anew.attempt, 1,
        "a record past its retention starts anew, whatever its old fingerprint"
    );
    assert!(anew.fence > expired_fence, "the fence rises across expiry");
    assert_eq!(
        outcomes[4],
        ClaimOutcome::Completed(Bytes::from_static(b"done"))
    );
    assert_eq!(outcomes[5], ClaimOutcome::Failed(refused));
    assert_eq!(outcomes[6], ClaimOutcome::Mismatch);
    assert_lease_lost(
        f.store
            .complete(&stale_lease, Bytes::from_static(b"late"), LONG)
            .await,
        "complete by the holder a batch took over from",
    );
    let record = f.store.get(&expired).await.expect("get").expect("present");
    assert_eq!(record.fingerprint, b.fingerprint);
}

/// Batches and single claims racing over the same keys: every key is
/// acquired exactly once, whatever order each batch lists them in.
pub async fn concurrent_batches_on_overlapping_keys<S: Batches>(f: &Fixture<S>) {
    const KEYS: usize = 120;
    const TASKS: usize = 8;
    let scope = f.scope("s");
    let ids: Arc<Vec<RecordId>> =
        Arc::new((0..KEYS).map(|i| id(&scope, &format!("k{i}"))).collect());
    let p = ClaimParams::new(Duration::from_secs(60), LONG);
    let barrier = Arc::new(Barrier::new(2 * TASKS));
    let task = || {
        (
            Arc::clone(&f.store),
            Arc::clone(&ids),
            p.clone(),
            Arc::clone(&barrier),
        )
    };
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (store, ids, p, barrier) = task();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut won = Vec::new();
            // Batches of 40, each listing its keys in a rotated (odd tasks:
            // reversed) order, one key twice.
            for chunk in 0..KEYS / 40 {
                let mut indexes: Vec<usize> =
                    (0..40).map(|i| (chunk * 40 + i + t * 13) % KEYS).collect();
                if t % 2 == 1 {
                    indexes.reverse();
                }
                indexes.push(indexes[0]);
                let batch: Vec<(RecordId, ClaimParams)> = indexes
                    .iter()
                    .map(|&i| (ids[i].clone(), p.clone()))
                    .collect();
                let results = store.claim_many(&batch).await.expect("batch");
                for (&index, result) in indexes.iter().zip(results) {
                    if let ClaimOutcome::Acquired(_) = result.expect("claim succeeds") {
                        won.push(index);
                    }
                }
            }
            won
        }));
        let (store, ids, p, barrier) = task();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut won = Vec::new();
            for i in 0..KEYS {
                let index = (i + t * 29) % KEYS;
                if let ClaimOutcome::Acquired(_) =
                    store.claim(&ids[index], &p).await.expect("claim succeeds")
                {
                    won.push(index);
                }
            }
            won
        }));
    }
    let mut per_key: HashMap<usize, usize> = HashMap::new();
    for task in tasks {
        for index in task.await.expect("task") {
            *per_key.entry(index).or_default() += 1;
        }
    }
    let doubled: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "keys acquired more than once: {doubled:?}"
    );
    assert_eq!(per_key.len(), KEYS, "every key must be acquired");
}

/// `complete_many` answers each completion in order, as single completes
/// would: each checked against its own token, a stale or finished lease
/// refused alone, a record named twice completed by the first only, every
/// retention kept, the stored bytes exact.
pub async fn batch_completes<S: Batches>(f: &Fixture<S>) {
    let scope = f.scope("s");
    // Long leases: nothing here waits for a lease to run out, and on a
    // slow server a short one could (k3's new holder taken over); only
    // k2's retention is short.
    let p = ClaimParams::new(LONG, LONG);
    let ids: Vec<RecordId> = (0..5).map(|i| id(&scope, &format!("k{i}"))).collect();
    let mut leases = Vec::new();
    for id in &ids {
        leases.push(acquire(f, id, &p).await);
    }
    f.store.release(&leases[3]).await.expect("release");
    let holder = acquire(f, &ids[3], &p).await;
    f.store
        .complete(&leases[4], Bytes::from_static(b"four"), LONG)
        .await
        .expect("complete");
    assert!(
        f.store.complete_many(&[]).await.expect("empty").is_empty(),
        "an empty batch answers nothing"
    );

    let binary = Bytes::from_static(b"\0one\xff\r\n");
    let batch = vec![
        Completion::new(leases[0].clone(), Bytes::from_static(b"first"), LONG),
        Completion::new(leases[1].clone(), binary.clone(), LONG),
        Completion::new(leases[3].clone(), Bytes::from_static(b"stale"), LONG),
        Completion::new(leases[4].clone(), Bytes::from_static(b"late"), LONG),
        Completion::new(leases[0].clone(), Bytes::from_static(b"second"), LONG),
        Completion::new(leases[2].clone(), Bytes::from_static(b"short"), f.lease),
    ];
    let results = f.store.complete_many(&batch).await.expect("batch");
    assert_eq!(results.len(), batch.len(), "one result per completion");
    let mut results = results.into_iter();
    let mut next = || results.next().expect("counted");
    next().expect("the holder completes k0");
    next().expect("the holder completes k1");
    assert_lease_lost(next(), "a batch completion by a released holder");
    assert_lease_lost(next(), "a batch completion of a completed record");
    assert_lease_lost(next(), "the second completion of one lease in a batch");
    next().expect("the holder completes k2");

    let replay = |bytes: &'static [u8]| ClaimOutcome::Completed(Bytes::from_static(bytes));
    // k2 first: its retention is the short one.
    assert_eq!(claim(f, &ids[2], &p).await, replay(b"short"));
    assert_eq!(claim(f, &ids[0], &p).await, replay(b"first"));
    assert_eq!(claim(f, &ids[1], &p).await, ClaimOutcome::Completed(binary));
    assert_eq!(claim(f, &ids[4], &p).await, replay(b"four"), "unchanged");
    assert!(
        matches!(claim(f, &ids[3], &p).await, ClaimOutcome::InProgress { .. }),
        "the refused completion left the new holder's claim alone"
    );
    f.store
        .complete(&holder, Bytes::from_static(b"three"), LONG)
        .await
        .expect("the new holder still completes");

    f.advance(f.lease).await;
    match claim(f, &ids[2], &p).await {
        ClaimOutcome::Acquired(lease) => assert_eq!(
            lease.attempt, 1,
            "a batch completion's own retention is kept: past it the record starts anew"
        ),
        other => panic!("k2 should have expired with its short retention, got {other:?}"),
    }
    assert_eq!(claim(f, &ids[0], &p).await, replay(b"first"));
}

/// Batch completions racing single writes (terminal fails and releases)
/// by the same holders: for every record exactly one write lands, and the
/// record is what that write made it.
pub async fn batch_completes_race_single_writes<S: Batches>(f: &Fixture<S>) {
    const KEYS: usize = 60;
    let scope = f.scope("s");
    let p = ClaimParams::new(std::time::Duration::from_secs(60), LONG);
    let ids: Vec<RecordId> = (0..KEYS).map(|i| id(&scope, &format!("k{i}"))).collect();
    let mut leases: Vec<Lease> = Vec::new();
    for id in &ids {
        leases.push(acquire(f, id, &p).await);
    }
    let leases = Arc::new(leases);
    let barrier = Arc::new(Barrier::new(2));
    let shared = || {
        (
            Arc::clone(&f.store),
            Arc::clone(&leases),
            Arc::clone(&barrier),
        )
    };
    let batches = {
        let (store, leases, barrier) = shared();
        tokio::spawn(async move {
            barrier.wait().await;
            let mut won = vec![false; KEYS];
            // Batches of 20, in reverse order, so they meet the single
            // writes (which go forwards) in the middle.
            let order: Vec<usize> = (0..KEYS).rev().collect();
            for chunk in order.chunks(20) {
                let batch: Vec<Completion> = chunk
                    .iter()
                    .map(|&i| {
                        let response = Bytes::from(format!("done {i}"));
                        Completion::new(leases[i].clone(), response, LONG)
                    })
                    .collect();
                let results = store.complete_many(&batch).await.expect("batch");
                for (&i, result) in chunk.iter().zip(results) {
                    match result {
                        Ok(()) => won[i] = true,
                        Err(StoreError::LeaseLost) => {}
                        Err(other) => panic!("completion of k{i} failed: {other:?}"),
                    }
                }
            }
            won
        })
    };
    let singles = {
        let (store, leases, barrier) = shared();
        tokio::spawn(async move {
            barrier.wait().await;
            let mut won = vec![false; KEYS];
            for (i, lease) in leases.iter().enumerate() {
                let written = if i % 2 == 0 {
                    let failure = Failure::new(FailureClass::Terminal, format!("refused {i}"));
                    store.fail(lease, failure, LONG).await
                } else {
                    store.release(lease).await
                };
                match written {
                    Ok(()) => won[i] = true,
                    Err(StoreError::LeaseLost) => {}
                    Err(other) => panic!("single write of k{i} failed: {other:?}"),
                }
            }
            won
        })
    };
    let batched = batches.await.expect("batch task");
    let single = singles.await.expect("single task");
    for i in 0..KEYS {
        assert!(
            batched[i] != single[i],
            "k{i}: exactly one write must land (batch {}, single {})",
            batched[i],
            single[i]
        );
        let outcome = claim(f, &ids[i], &p).await;
        match (batched[i], i % 2) {
            (true, _) => assert_eq!(
                outcome,
                ClaimOutcome::Completed(Bytes::from(format!("done {i}"))),
                "k{i}"
            ),
            (false, 0) => assert_eq!(
                outcome,
                ClaimOutcome::Failed(Failure::new(FailureClass::Terminal, format!("refused {i}"))),
                "k{i}"
            ),
            (false, _) => match outcome {
                ClaimOutcome::Acquired(lease) => assert_eq!(lease.attempt, 2, "k{i}"),
                other => panic!("k{i} was released, so it is claimed again: {other:?}"),
            },
        }
    }
}
