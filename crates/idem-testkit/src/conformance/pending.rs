//! The outbox's pending index, for stores that keep one
//! ([`PendingSends`]): a run is marked pending by its completion's own
//! write, held by its completer, taken once by one taker after the hold,
//! and cleared by the confirmation of the fence it was completed under.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{PendingRun, PendingSends};
use idem::Store;

use super::{acquire, assert_lease_lost, id, params, Core, Fixture};

/// What the [`pending`](self) cases need.
pub trait Pending: Core + PendingSends {}
impl<S: Core + PendingSends> Pending for S {}

/// A store that implements [`PendingSends`] names it in
/// [`idem::store_capabilities!`], so the executor finds it.
pub async fn the_index_reaches_the_executor<S: Pending>(f: &Fixture<S>) {
    assert!(
        f.store.pending_sends().is_some(),
        "Store::pending_sends is None although the store implements PendingSends: \
         name `pending` in store_capabilities!"
    );
}

/// The mark is written with the completion and held for the hold: no
/// taker sees it before; after the hold one taker gets the run (its fence
/// and stored response), the next finds it held; a confirmation naming
/// another fence leaves it, the run's own clears it.
pub async fn a_mark_is_held_then_taken_once_and_cleared_by_its_fence<S: Pending>(f: &Fixture<S>) {
    let scope = f.scope("pending");
    let run = id(&scope, "order-1");
    let hold = f.lease;
    let lease = acquire(f, &run, &params(f)).await;
    f.store
        .complete_pending(&lease, Bytes::from_static(b"charged"), LONG_KEEP, hold)
        .await
        .expect("the completion is stored");
    assert!(
        f.store
            .take_pending(&scope, hold, 16)
            .await
            .expect("a look")
            .is_empty(),
        "a mark was taken while its completer held it"
    );
    assert_eq!(
        f.store.take_pending_run(&run, hold).await.expect("a look"),
        None
    );

    f.advance(hold).await;
    let taken = f
        .store
        .take_pending(&scope, hold, 16)
        .await
        .expect("a look");
    assert_eq!(
        taken,
        [PendingRun {
            id: run.clone(),
            fence: lease.fence,
            response: Bytes::from_static(b"charged"),
        }]
    );
    assert!(
        f.store
            .take_pending(&scope, hold, 16)
            .await
            .expect("a look")
            .is_empty(),
        "a run was taken twice within its taker's hold"
    );

    f.store
        .confirm_sent(&run, lease.fence + 1)
        .await
        .expect("a confirmation of another fence is no error");
    f.advance(hold).await;
    let again = f.store.take_pending_run(&run, hold).await.expect("a look");
    assert_eq!(
        again.map(|p| p.fence),
        Some(lease.fence),
        "another fence's confirmation cleared the mark"
    );
    f.store
        .confirm_sent(&run, lease.fence)
        .await
        .expect("confirmed");
    f.store
        .confirm_sent(&run, lease.fence)
        .await
        .expect("twice is no error");
    f.advance(hold).await;
    assert!(f
        .store
        .take_pending(&scope, hold, 16)
        .await
        .expect("a look")
        .is_empty());
    assert_eq!(
        f.store.take_pending_run(&run, hold).await.expect("a look"),
        None
    );
}

/// A completion whose lease was lost writes neither the response nor the
/// mark; a run completed without one (plain `complete`) has none; marks
/// are per scope.
pub async fn only_a_held_completion_marks_and_marks_stay_in_their_scope<S: Pending>(
    f: &Fixture<S>,
) {
    let scope = f.scope("pending");
    let other = f.scope("elsewhere");
    let hold = Duration::ZERO;
    let stale = acquire(f, &id(&scope, "lost"), &params(f)).await;
    f.advance(f.lease).await;
    let _taker = acquire(f, &id(&scope, "lost"), &params(f)).await;
    let lost = f
        .store
        .complete_pending(&stale, Bytes::from_static(b"late"), LONG_KEEP, hold)
        .await;
    assert_lease_lost(lost, "complete_pending");

    let plain = acquire(f, &id(&scope, "plain"), &params(f)).await;
    f.store
        .complete(&plain, Bytes::from_static(b"no messages"), LONG_KEEP)
        .await
        .expect("stored");
    let elsewhere = acquire(f, &id(&other, "marked"), &params(f)).await;
    f.store
        .complete_pending(&elsewhere, Bytes::from_static(b"sent"), LONG_KEEP, hold)
        .await
        .expect("stored");

    assert!(
        f.store
            .take_pending(&scope, hold, 16)
            .await
            .expect("a look")
            .is_empty(),
        "a run with no mark, or another scope's, was taken"
    );
    let taken = f
        .store
        .take_pending(&other, hold, 16)
        .await
        .expect("a look");
    assert_eq!(taken.len(), 1, "{taken:?}");
}

/// A mark goes no further than its record: once the record expired, or
/// a new run of the key holds it, nothing is taken for the old run.
pub async fn a_mark_ends_with_its_record<S: Pending>(f: &Fixture<S>) {
    let scope = f.scope("pending");
    let run = id(&scope, "short");
    let hold = Duration::ZERO;
    let lease = acquire(f, &run, &params(f)).await;
    f.store
        .complete_pending(&lease, Bytes::from_static(b"kept briefly"), f.lease, hold)
        .await
        .expect("stored");
    f.advance(f.lease).await;
    assert!(
        f.store
            .take_pending(&scope, hold, 16)
            .await
            .expect("a look")
            .is_empty(),
        "a run whose record expired was taken"
    );
    let again = acquire(f, &run, &params(f)).await;
    assert!(again.fence > lease.fence);
    assert_eq!(
        f.store.take_pending_run(&run, hold).await.expect("a look"),
        None,
        "the old run's mark was taken while a new run holds the key"
    );
}

/// Many runs, several takers at once: every run is taken by exactly one.
pub async fn concurrent_takers_take_each_run_once<S: Pending>(f: &Fixture<S>) {
    const RUNS: usize = 40;
    let scope = f.scope("pending");
    let hold = Duration::from_secs(3600);
    for n in 0..RUNS {
        let lease = acquire(f, &id(&scope, &format!("run-{n}")), &params(f)).await;
        f.store
            .complete_pending(
                &lease,
                Bytes::from(format!("r{n}")),
                LONG_KEEP,
                Duration::ZERO,
            )
            .await
            .expect("stored");
    }
    let takers = (0..4).map(|_| {
        let store = Arc::clone(&f.store);
        let scope = scope.clone();
        tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let taken = store.take_pending(&scope, hold, 7).await.expect("a look");
                if taken.is_empty() {
                    return mine;
                }
                mine.extend(taken.into_iter().map(|p| p.id));
            }
        })
    });
    let mut all = Vec::new();
    for taker in takers.collect::<Vec<_>>() {
        all.extend(taker.await.expect("the taker ran"));
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(distinct.len(), all.len(), "a run was taken twice");
    assert_eq!(all.len(), RUNS, "runs taken by all takers together");
}

const LONG_KEEP: Duration = Duration::from_secs(3600);
