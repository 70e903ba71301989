//! Conformance cases of `complete_many`.

use std::sync::Arc;

use bytes::Bytes;
use idem::{
    ClaimOutcome, ClaimParams, Completion, Failure, FailureClass, Lease, RecordId, StoreError,
};
use tokio::sync::Barrier;

use super::{acquire, assert_lease_lost, claim, id, LONG};
use crate::{ConformanceStore, Fixture};

/// `complete_many` answers each completion in order, as single completes
/// would: each checked against its own token, a stale or finished lease
/// refused alone, a record named twice completed by the first only, every
/// retention kept, the stored bytes exact.
pub async fn batch_completes<S: ConformanceStore>(f: &Fixture<S>) {
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
pub async fn batch_completes_race_single_writes<S: ConformanceStore>(f: &Fixture<S>) {
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
