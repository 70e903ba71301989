//! The conformance cases. Each takes a [`Fixture`] and panics with a
//! message saying which rule of the contract the store broke.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::{
    ClaimOutcome, ClaimParams, Failure, FailureClass, Fingerprint, Key, Lease, LeaseToken,
    ListQuery, RecordId, Resolution, Resolved, Scope, State, StateKind, StepBegin, StepEntry,
    StepState, StoreError,
};
use tokio::sync::Barrier;

use crate::{ConformanceStore, Fixture};

mod completions;
pub use completions::{batch_completes, batch_completes_race_single_writes};

const LONG: Duration = Duration::from_secs(3600);

fn id(scope: &Scope, key: &str) -> RecordId {
    RecordId::new(scope.clone(), Key::new(key).expect("test keys are valid"))
}

fn params<S>(f: &Fixture<S>) -> ClaimParams {
    ClaimParams::new(f.lease, LONG)
}

async fn acquire<S: ConformanceStore>(f: &Fixture<S>, id: &RecordId, p: &ClaimParams) -> Lease {
    match f.store.claim(id, p).await.expect("claim succeeds") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("expected {id} to be acquired, got {other:?}"),
    }
}

async fn claim<S: ConformanceStore>(
    f: &Fixture<S>,
    id: &RecordId,
    p: &ClaimParams,
) -> ClaimOutcome {
    f.store.claim(id, p).await.expect("claim succeeds")
}

fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost)),
        "{what} with a stale token must be LeaseLost, got {result:?}"
    );
}

/// Every write with `lease` (complete, terminal and retryable fail, extend,
/// release) must be refused as `LeaseLost`.
async fn assert_every_write_rejected<S: ConformanceStore>(f: &Fixture<S>, lease: &Lease) {
    let late = Bytes::from_static(b"late");
    assert_lease_lost(f.store.complete(lease, late, LONG).await, "complete");
    for class in [FailureClass::Terminal, FailureClass::Retryable] {
        let failure = Failure::new(class, "late");
        assert_lease_lost(f.store.fail(lease, failure, LONG).await, "fail");
    }
    assert_lease_lost(f.store.extend(lease, LONG).await, "extend");
    assert_lease_lost(f.store.release(lease).await, "release");
}

/// Claim, complete, and every later claim replays the stored bytes.
pub async fn claim_complete_replay<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k1");
    let p = params(f);
    let lease = acquire(f, &id, &p).await;
    assert_eq!(lease.id, id);
    assert_eq!(lease.attempt, 1, "first claim is attempt 1");
    assert!(!lease.takeover, "first claim is not a takeover");
    f.store
        .complete(&lease, Bytes::from_static(b"response"), LONG)
        .await
        .expect("holder completes");
    for _ in 0..3 {
        assert_eq!(
            claim(f, &id, &p).await,
            ClaimOutcome::Completed(Bytes::from_static(b"response"))
        );
    }
    let record = f
        .store
        .get(&id)
        .await
        .expect("get")
        .expect("record present");
    assert_eq!(
        record.state,
        State::Completed {
            response: Bytes::from_static(b"response")
        }
    );
    assert_eq!(record.attempt, 1);
    assert_eq!(record.fence, lease.fence);
    assert_eq!(record.fingerprint, None);
    assert_lease_lost(
        f.store
            .complete(&lease, Bytes::from_static(b"again"), LONG)
            .await,
        "a second complete",
    );
    assert_eq!(
        claim(f, &id, &p).await,
        ClaimOutcome::Completed(Bytes::from_static(b"response"))
    );
}

/// The longest lease and retention the API accepts (`Duration::MAX`,
/// "forever") are held as such: the claim stands (a second claim finds it
/// in progress, not acquired again), the lease extends, and the completed
/// or failed record is replayed and outlives any purge.
pub async fn the_longest_durations_are_held<S: ConformanceStore>(f: &Fixture<S>) {
    let forever = Duration::MAX;
    let p = ClaimParams::new(forever, forever);
    let scope = f.scope("s");
    let (done, failed) = (id(&scope, "kept"), id(&scope, "refused"));
    let lease = acquire(f, &done, &p).await;
    for step in ["claimed", "extended"] {
        match claim(f, &done, &p).await {
            ClaimOutcome::InProgress { .. } => {}
            other => panic!("{step} for ever, a second claim must find it in progress: {other:?}"),
        }
        if step == "claimed" {
            f.store
                .extend(&lease, forever)
                .await
                .expect("a lease extends for ever");
        }
    }
    f.store
        .complete(&lease, Bytes::from_static(b"kept"), forever)
        .await
        .expect("the holder of a forever lease completes");
    let other = acquire(f, &failed, &p).await;
    f.store
        .fail(
            &other,
            Failure::new(FailureClass::Terminal, "declined"),
            forever,
        )
        .await
        .expect("the holder of a forever lease fails");
    f.advance(Duration::from_millis(10)).await;
    f.store.purge_expired(1000).await.expect("purge");
    assert_eq!(
        claim(f, &done, &p).await,
        ClaimOutcome::Completed(Bytes::from_static(b"kept"))
    );
    assert!(
        matches!(claim(f, &failed, &p).await, ClaimOutcome::Failed(ref failure) if failure.message == "declined"),
        "a failure kept for ever is replayed"
    );
    let record = f.store.get(&done).await.expect("get").expect("kept");
    let century = Duration::from_secs(50 * 365 * 24 * 3600);
    assert!(
        record.expires_at >= record.updated_at.saturating_add(century),
        "kept for ever, not {:?} after its completion",
        record.expires_at.as_millis() - record.updated_at.as_millis()
    );
}

/// A live record binds its key to its fingerprint in every state.
pub async fn mismatch_is_refused_in_every_live_state<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let a = params(f).fingerprint(Fingerprint::of_bytes(b"a"));
    let b = params(f).fingerprint(Fingerprint::of_bytes(b"b"));
    let none = params(f);

    let k = id(&scope, "in-progress-then-completed");
    let lease = acquire(f, &k, &a).await;
    assert_eq!(
        claim(f, &k, &b).await,
        ClaimOutcome::Mismatch,
        "in progress, other fingerprint"
    );
    assert_eq!(
        claim(f, &k, &none).await,
        ClaimOutcome::Mismatch,
        "in progress, no fingerprint"
    );
    f.store
        .complete(&lease, Bytes::from_static(b"ok"), LONG)
        .await
        .expect("complete");
    assert_eq!(
        claim(f, &k, &b).await,
        ClaimOutcome::Mismatch,
        "completed, other fingerprint"
    );
    assert_eq!(
        claim(f, &k, &a).await,
        ClaimOutcome::Completed(Bytes::from_static(b"ok"))
    );
    let record = f.store.get(&k).await.expect("get").expect("present");
    assert_eq!(record.fingerprint, a.fingerprint);

    let k = id(&scope, "failed");
    let lease = acquire(f, &k, &a).await;
    f.store
        .fail(&lease, Failure::new(FailureClass::Terminal, "no"), LONG)
        .await
        .expect("fail");
    assert_eq!(
        claim(f, &k, &b).await,
        ClaimOutcome::Mismatch,
        "failed, other fingerprint"
    );

    let k = id(&scope, "released");
    let lease = acquire(f, &k, &a).await;
    f.store.release(&lease).await.expect("release");
    assert_eq!(
        claim(f, &k, &b).await,
        ClaimOutcome::Mismatch,
        "released, other fingerprint"
    );
    assert_eq!(acquire(f, &k, &a).await.attempt, 2);
}

/// A live lease answers `InProgress` with the time left on it.
pub async fn live_lease_reports_retry_after<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    acquire(f, &id, &p).await;
    match claim(f, &id, &p).await {
        ClaimOutcome::InProgress { retry_after } => assert!(
            !retry_after.is_zero() && retry_after <= f.lease,
            "retry_after {retry_after:?} must be in (0, {:?}]",
            f.lease
        ),
        other => panic!("a live lease must answer InProgress, got {other:?}"),
    }
}

/// An expired lease is taken over: new token, attempt + 1, higher fence.
pub async fn expired_lease_is_taken_over<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    let first = acquire(f, &id, &p).await;
    f.advance(f.lease).await;
    let second = acquire(f, &id, &p).await;
    assert!(second.takeover, "claiming an expired lease is a takeover");
    assert_eq!(second.attempt, 2, "a takeover is attempt + 1");
    assert_ne!(second.token, first.token, "a takeover gets a new token");
    assert!(
        second.fence > first.fence,
        "fence must rise: {} then {}",
        first.fence,
        second.fence
    );
    assert!(matches!(
        claim(f, &id, &p).await,
        ClaimOutcome::InProgress { .. }
    ));
    let record = f.store.get(&id).await.expect("get").expect("present");
    assert!(matches!(record.state, State::InProgress { token, .. } if token == second.token));
}

/// Once a record leaves "in progress", its last holder can write nothing:
/// not complete, fail, extend nor release, whatever state it is now in.
pub async fn finished_records_reject_every_write<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    let finishes: [(&str, Option<Failure>); 4] = [
        ("completed", None),
        ("failed", Some(Failure::new(FailureClass::Terminal, "no"))),
        (
            "retried",
            Some(Failure::new(FailureClass::Retryable, "later")),
        ),
        ("released", None),
    ];
    for (name, failure) in finishes {
        let id = id(&scope, name);
        let lease = acquire(f, &id, &p).await;
        match (name, failure) {
            ("completed", _) => {
                f.store
                    .complete(&lease, Bytes::from_static(b"done"), LONG)
                    .await
            }
            ("released", _) => f.store.release(&lease).await,
            (_, Some(failure)) => f.store.fail(&lease, failure, LONG).await,
            _ => unreachable!(),
        }
        .expect("holder finishes");
        let before = f.store.get(&id).await.expect("get");
        assert_every_write_rejected(f, &lease).await;
        assert_eq!(
            f.store.get(&id).await.expect("get"),
            before,
            "{name} record changed after a rejected write"
        );
    }
}

/// The old holder can neither complete, fail, extend nor release.
pub async fn stale_token_is_rejected_by_every_write<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    let old = acquire(f, &id, &p).await;
    f.advance(f.lease).await;
    let new = acquire(f, &id, &p).await;

    assert_every_write_rejected(f, &old).await;

    let record = f.store.get(&id).await.expect("get").expect("present");
    assert!(
        matches!(record.state, State::InProgress { token, .. } if token == new.token),
        "stale writes must change nothing, found {:?}",
        record.state
    );
    f.store
        .complete(&new, Bytes::from_static(b"fresh"), LONG)
        .await
        .expect("new holder completes");
    assert_eq!(
        claim(f, &id, &p).await,
        ClaimOutcome::Completed(Bytes::from_static(b"fresh"))
    );
}

/// Tokens never repeat and fences only rise, across release, delete and
/// expiry of the record.
pub async fn tokens_are_never_reused<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    let mut tokens: HashSet<LeaseToken> = HashSet::new();
    let mut last_fence = 0u64;
    let mut check = |lease: &Lease, how: &str| {
        assert!(
            tokens.insert(lease.token),
            "token {} reused after {how}",
            lease.token
        );
        assert!(
            lease.fence > last_fence,
            "fence {} after {how} is not above {last_fence}",
            lease.fence
        );
        last_fence = lease.fence;
    };

    for _ in 0..50 {
        let lease = acquire(f, &id, &p).await;
        check(&lease, "release");
        f.store.release(&lease).await.expect("release");
    }
    for _ in 0..20 {
        let lease = acquire(f, &id, &p).await;
        check(&lease, "delete");
        assert!(f.store.delete(&id).await.expect("delete"));
    }
    let cycles = if f.is_manual() { 30 } else { 3 };
    for _ in 0..cycles {
        let lease = acquire(f, &id, &p).await;
        check(&lease, "expiry");
        assert_eq!(lease.attempt, 1, "an expired record is claimed afresh");
        f.store
            .complete(&lease, Bytes::from_static(b"x"), f.lease)
            .await
            .expect("complete");
        f.advance(f.lease).await;
        let next = acquire(f, &id, &p).await;
        assert!(
            !next.takeover,
            "claiming an expired record is not a takeover"
        );
        check(&next, "expiry");
        assert_lease_lost(
            f.store
                .complete(&lease, Bytes::from_static(b"old"), LONG)
                .await,
            "complete after expiry",
        );
        f.store.release(&next).await.expect("release");
        assert!(f.store.delete(&id).await.expect("delete"));
    }
}

/// An expired record is absent on read, before any purge, whatever its
/// state: it is neither listed, nor replayed, nor bound to its fingerprint,
/// nor taken over.
pub async fn expiry_is_honoured_at_read_time<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let a = ClaimParams::new(f.lease, f.lease).fingerprint(Fingerprint::of_bytes(b"a"));
    let b = ClaimParams::new(f.lease, f.lease).fingerprint(Fingerprint::of_bytes(b"b"));
    for state in ["completed", "failed", "released", "in-progress"] {
        let id = id(&scope, state);
        let lease = acquire(f, &id, &a).await;
        match state {
            "completed" => {
                f.store
                    .complete(&lease, Bytes::from_static(b"old"), f.lease)
                    .await
            }
            "failed" => {
                f.store
                    .fail(&lease, Failure::new(FailureClass::Terminal, "old"), f.lease)
                    .await
            }
            "released" => f.store.release(&lease).await,
            _ => Ok(()),
        }
        .expect("holder writes");
        assert!(f.store.get(&id).await.expect("get").is_some());
    }
    f.advance(f.lease).await;
    let listed = f
        .store
        .list(&ListQuery::new(10).scope(scope.clone()))
        .await
        .expect("list");
    assert!(
        listed.records.is_empty(),
        "expired records must not be listed: {listed:?}"
    );
    for state in ["completed", "failed", "released", "in-progress"] {
        let id = id(&scope, state);
        assert_eq!(
            f.store.get(&id).await.expect("get"),
            None,
            "expired {state} record must read as absent"
        );
        let again = acquire(f, &id, &b).await;
        assert_eq!(
            (again.attempt, again.takeover),
            (1, false),
            "an expired {state} record is claimed as new, with any fingerprint"
        );
    }
}

/// `peek` reads a record as `get` does and never claims or creates one:
/// an absent or expired key stays unclaimed (the next claim is a new
/// record that takes any fingerprint), and a live claim is not taken over.
pub async fn peek_reads_without_claiming<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let a = ClaimParams::new(f.lease, f.lease).fingerprint(Fingerprint::of_bytes(b"a"));
    let b = ClaimParams::new(f.lease, f.lease).fingerprint(Fingerprint::of_bytes(b"b"));
    let absent = id(&scope, "absent");
    assert_eq!(f.store.peek(&absent).await.expect("peek"), None);
    assert_eq!(
        f.store.get(&absent).await.expect("get"),
        None,
        "peek made no record"
    );

    let live = id(&scope, "live");
    let lease = acquire(f, &live, &a).await;
    let seen = f.store.peek(&live).await.expect("peek");
    assert_eq!(
        seen,
        f.store.get(&live).await.expect("get"),
        "peek reads as get"
    );
    assert!(
        matches!(seen.map(|r| r.state), Some(State::InProgress { token, .. }) if token == lease.token),
        "peek shows the live claim"
    );
    assert!(
        matches!(claim(f, &live, &a).await, ClaimOutcome::InProgress { .. }),
        "peek took nothing over"
    );

    let done = id(&scope, "done");
    let held = acquire(f, &done, &a).await;
    f.store
        .complete(&held, Bytes::from_static(b"kept"), f.lease)
        .await
        .expect("complete");
    let seen = f.store.peek(&done).await.expect("peek").expect("present");
    assert_eq!(
        seen.state,
        State::Completed {
            response: Bytes::from_static(b"kept")
        }
    );

    f.advance(f.lease).await;
    for key in ["absent", "done"] {
        let id = id(&scope, key);
        assert_eq!(
            f.store.peek(&id).await.expect("peek"),
            None,
            "{key} is gone"
        );
        let fresh = acquire(f, &id, &b).await;
        assert_eq!(
            (fresh.attempt, fresh.takeover),
            (1, false),
            "after peeks, {key} is claimed as new with any fingerprint"
        );
    }
}

/// A released record is acquired again with the attempt count carried on.
pub async fn released_record_is_reclaimed<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    let first = acquire(f, &id, &p).await;
    f.store.release(&first).await.expect("release");
    let record = f.store.get(&id).await.expect("get").expect("present");
    assert_eq!(record.state, State::Released { last_failure: None });
    let second = acquire(f, &id, &p).await;
    assert_eq!(second.attempt, 2);
    assert!(
        !second.takeover,
        "reclaiming a released record is not a takeover"
    );
    let busy = Failure::new(FailureClass::Retryable, "downstream busy");
    f.store
        .fail(&second, busy.clone(), LONG)
        .await
        .expect("fail");
    let record = f.store.get(&id).await.expect("get").expect("present");
    assert_eq!(
        record.state,
        State::Released {
            last_failure: Some(busy)
        }
    );
    assert_eq!(acquire(f, &id, &p).await.attempt, 3);
}

/// Terminal and unknown failures are stored and replayed with their class.
pub async fn failures_are_classified<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    for class in [FailureClass::Terminal, FailureClass::Unknown] {
        let id = id(&scope, class.as_str());
        let lease = acquire(f, &id, &p).await;
        let failure = Failure::new(class, format!("{class} failure: card declined"));
        f.store
            .fail(&lease, failure.clone(), LONG)
            .await
            .expect("fail");
        assert_eq!(
            claim(f, &id, &p).await,
            ClaimOutcome::Failed(failure.clone())
        );
        let record = f.store.get(&id).await.expect("get").expect("present");
        assert_eq!(record.state, State::Failed { failure });
    }
}

/// A heartbeat keeps the lease past its original deadline.
pub async fn extend_keeps_the_lease<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    let lease = acquire(f, &id, &p).await;
    f.advance(f.lease / 3).await;
    let until = f
        .store
        .extend(&lease, f.lease * 3)
        .await
        .expect("holder extends");
    assert!(
        until > lease.lease_until,
        "extend must move the deadline forward"
    );
    // Past the original deadline, well inside the extended one.
    f.advance(f.lease).await;
    assert!(
        matches!(claim(f, &id, &p).await, ClaimOutcome::InProgress { .. }),
        "an extended lease must still be live past its original deadline"
    );
    f.advance(f.lease * 3).await;
    assert!(acquire(f, &id, &p).await.takeover);
}

/// 64 concurrent claimers on one key: exactly one acquires.
pub async fn concurrent_claimers_on_one_key<S: ConformanceStore>(f: &Fixture<S>) {
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
async fn race_claims<S: ConformanceStore>(f: &Fixture<S>, id: &RecordId) -> Vec<Lease> {
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
pub async fn concurrent_claimers_on_expired_and_released_records<S: ConformanceStore>(
    f: &Fixture<S>,
) {
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
pub async fn concurrent_claimers_on_many_keys<S: ConformanceStore>(f: &Fixture<S>) {
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

/// `claim_many` answers each claim in order, as single claims would.
pub async fn batch_claims<S: ConformanceStore>(f: &Fixture<S>) {
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
pub async fn batch_claims_follow_every_claim_rule<S: ConformanceStore>(f: &Fixture<S>) {
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
pub async fn concurrent_batches_on_overlapping_keys<S: ConformanceStore>(f: &Fixture<S>) {
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

/// Purge removes expired records and nothing else, in bounded batches.
pub async fn purge_removes_only_expired<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    for i in 0..5 {
        let lease = acquire(f, &id(&scope, &format!("short{i}")), &p).await;
        f.store
            .complete(&lease, Bytes::from_static(b"s"), f.lease)
            .await
            .expect("complete");
    }
    for i in 0..5 {
        let lease = acquire(f, &id(&scope, &format!("long{i}")), &p).await;
        f.store
            .complete(&lease, Bytes::from_static(b"l"), LONG)
            .await
            .expect("complete");
    }
    let long_claim = ClaimParams::new(LONG, LONG);
    for i in 0..2 {
        acquire(f, &id(&scope, &format!("running{i}")), &long_claim).await;
    }
    // Released twice: its attempt count must survive the purge.
    let released = id(&scope, "released");
    for _ in 0..2 {
        let lease = acquire(f, &released, &p).await;
        f.store.release(&lease).await.expect("release");
    }
    // Its lease runs out, its retention does not: purge must keep it.
    let stale = id(&scope, "stale-lease");
    acquire(f, &stale, &p).await;
    f.advance(f.lease).await;
    let mut purged = 0;
    loop {
        let n = f.store.purge_expired(3).await.expect("purge");
        assert!(
            n <= 3,
            "purge_expired(3) removed {n}: batches must be bounded"
        );
        purged += n;
        if n < 3 {
            break;
        }
    }
    if f.exclusive {
        assert_eq!(purged, 5, "exactly the 5 expired records are purged");
    } else {
        assert!(
            purged >= 5,
            "the 5 expired records are purged (got {purged})"
        );
    }
    for i in 0..5 {
        let record = f
            .store
            .get(&id(&scope, &format!("long{i}")))
            .await
            .expect("get");
        assert!(
            record.is_some(),
            "live record long{i} must survive the purge"
        );
    }
    let kept = f
        .store
        .get(&released)
        .await
        .expect("get")
        .expect("released record survives");
    assert_eq!((kept.state.kind(), kept.attempt), (StateKind::Released, 2));
    let kept = f
        .store
        .get(&stale)
        .await
        .expect("get")
        .expect("expired lease, live retention survives");
    assert_eq!(
        (kept.state.kind(), kept.attempt),
        (StateKind::InProgress, 1)
    );
    let listed = f
        .store
        .list(&ListQuery::new(100).scope(scope))
        .await
        .expect("list");
    assert_eq!(
        listed.records.len(),
        9,
        "5 completed + 2 running + released + stale lease remain"
    );
}

/// Delete force-releases: the old holder loses its lease, fences rise.
pub async fn delete_force_releases<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    let old = acquire(f, &id, &p).await;
    assert!(
        f.store.delete(&id).await.expect("delete"),
        "delete reports a live record"
    );
    assert_eq!(f.store.get(&id).await.expect("get"), None);
    let new = acquire(f, &id, &p).await;
    assert_eq!(new.attempt, 1);
    assert!(new.fence > old.fence, "fences rise across a delete");
    assert_lease_lost(
        f.store
            .complete(&old, Bytes::from_static(b"stale"), LONG)
            .await,
        "complete after delete",
    );
    assert!(f.store.delete(&id).await.expect("delete"));
    assert!(
        !f.store.delete(&id).await.expect("delete"),
        "deleting an absent record reports false"
    );
}

/// Lists filter by state and scope and page without gaps or repeats.
pub async fn list_by_state_and_scope<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("a");
    let other = f.scope("b");
    let p = params(f);
    for i in 0..3 {
        let lease = acquire(f, &id(&scope, &format!("done{i}")), &p).await;
        f.store
            .complete(&lease, Bytes::from_static(b"d"), LONG)
            .await
            .expect("complete");
    }
    for i in 0..2 {
        acquire(f, &id(&scope, &format!("run{i}")), &p).await;
    }
    let lease = acquire(f, &id(&scope, "failed"), &p).await;
    f.store
        .fail(&lease, Failure::new(FailureClass::Terminal, "x"), LONG)
        .await
        .expect("fail");
    let lease = acquire(f, &id(&scope, "released"), &p).await;
    f.store.release(&lease).await.expect("release");
    for i in 0..2 {
        let lease = acquire(f, &id(&other, &format!("done{i}")), &p).await;
        f.store
            .complete(&lease, Bytes::from_static(b"d"), LONG)
            .await
            .expect("complete");
    }

    let count = |state: StateKind| {
        let q = ListQuery::new(100).scope(scope.clone()).state(state);
        async move { f.store.list(&q).await.expect("list").records.len() }
    };
    assert_eq!(count(StateKind::Completed).await, 3);
    assert_eq!(count(StateKind::InProgress).await, 2);
    assert_eq!(count(StateKind::Failed).await, 1);
    assert_eq!(count(StateKind::Released).await, 1);

    let mut seen = Vec::new();
    let mut query = ListQuery::new(2).scope(scope.clone());
    loop {
        let page = f.store.list(&query).await.expect("list");
        assert!(page.records.len() <= 2, "pages are bounded by the limit");
        for (id, record) in &page.records {
            assert_eq!(id.scope(), &scope, "scope filter");
            assert!(!matches!(record.state, State::Completed { .. }) || record.attempt == 1);
        }
        seen.extend(page.records.into_iter().map(|(id, _)| id));
        match page.next {
            Some(next) => query = query.after(next),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted, "pages are in id order without repeats");
    assert_eq!(seen.len(), 7, "paging sees all 7 records of the scope");
}

/// Arbitrary response bytes and failure text survive storage unchanged.
pub async fn stored_bytes_round_trip<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    let big: Vec<u8> = (0..65_536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    let payloads = [
        Bytes::new(),
        Bytes::from_static(&[0, 255, 0, b'\n', 0x80]),
        Bytes::from(big),
    ];
    for (i, payload) in payloads.into_iter().enumerate() {
        let id = id(&scope, &format!("bytes{i}"));
        let lease = acquire(f, &id, &p).await;
        f.store
            .complete(&lease, payload.clone(), LONG)
            .await
            .expect("complete");
        assert_eq!(
            claim(f, &id, &p).await,
            ClaimOutcome::Completed(payload),
            "payload {i} must round-trip"
        );
    }
    let id = id(&scope, "text");
    let lease = acquire(f, &id, &p).await;
    let failure = Failure::new(
        FailureClass::Terminal,
        "déclinée\n\"quoted\" \u{1F4B3}\0end",
    );
    f.store
        .fail(&lease, failure.clone(), LONG)
        .await
        .expect("fail");
    assert_eq!(claim(f, &id, &p).await, ClaimOutcome::Failed(failure));
}

/// A task that calls the store in a loop must still give its worker thread
/// back to the runtime now and then: a store whose calls always finish at
/// once (an embedded one) takes part in tokio's cooperative budget, so other
/// tasks on the same worker (timers, the executor's heartbeats) are not
/// starved. Counts the calls that yielded over a run of claims and
/// completions.
pub async fn calls_yield_to_the_runtime<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("yield");
    let p = params(f);
    let mut yielded = 0usize;
    let mut polls = |pending: bool| yielded += usize::from(pending);
    for i in 0..1_000 {
        let id = id(&scope, &format!("k{i}"));
        let lease = match counting(f.store.claim(&id, &p), &mut polls).await {
            Ok(ClaimOutcome::Acquired(lease)) => lease,
            other => panic!("expected {id} to be acquired, got {other:?}"),
        };
        counting(
            f.store.complete(&lease, Bytes::from_static(b"ok"), LONG),
            &mut polls,
        )
        .await
        .expect("complete");
    }
    assert!(
        yielded > 0,
        "2,000 store calls in one task never yielded to the runtime: a task \
         looping over this store would starve everything else on its worker"
    );
}

/// Awaits `fut`, telling `polled` after each poll whether it was pending.
async fn counting<F: std::future::Future>(fut: F, polled: &mut impl FnMut(bool)) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let poll = fut.as_mut().poll(cx);
        polled(poll.is_pending());
        poll
    })
    .await
}

fn done(result: &[u8]) -> StepState {
    StepState::Done {
        result: Bytes::copy_from_slice(result),
    }
}

/// The optional capabilities the store implements reach the executor
/// through its `Store` impl: a store that implements [`StepJournal`] and
/// [`idem::GetRecord`] but does not name them in
/// [`idem::store_capabilities!`] compiles, and fails here (the executor
/// would refuse every step and treat every lost answer as unknown).
pub async fn capabilities_reach_the_executor<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let lease = acquire(f, &id, &params(f)).await;
    let journal = f.store.step_journal().expect(
        "Store::step_journal is None although the store implements StepJournal: \
         name `steps` in store_capabilities!",
    );
    assert_eq!(
        journal.begin_step(&lease, "wired").await.expect("begin_step"),
        StepBegin::Fresh
    );
    journal
        .finish_step(&lease, "wired", Bytes::from_static(b"through the executor's journal"))
        .await
        .expect("finish_step");
    assert_eq!(
        begin(f, &lease, "wired").await,
        StepBegin::Done(Bytes::from_static(b"through the executor's journal")),
        "the journal the executor gets is the store's own"
    );
    let peeked = f.store.peek(&id).await.expect(
        "Store::peek failed although the store implements GetRecord: \
         name `peek` in store_capabilities!",
    );
    assert_eq!(peeked, f.store.get(&id).await.expect("get"));
    assert!(
        matches!(peeked.map(|r| r.state), Some(State::InProgress { token, .. }) if token == lease.token),
        "peek reads the live claim"
    );
}

async fn begin<S: ConformanceStore>(f: &Fixture<S>, lease: &Lease, step: &str) -> StepBegin {
    f.store.begin_step(lease, step).await.expect("begin_step")
}

/// A step is marked started before it runs and journaled when it
/// finishes; a finished step is replayed to later attempts (byte for
/// byte), and a step left started is reported in doubt with the attempt
/// that started it — to a later attempt only: the same attempt beginning
/// it again is retrying a `begin_step` whose answer was lost, and the
/// step has not run (DESIGN §7).
pub async fn steps_are_journaled_and_replayed<S: ConformanceStore>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let p = params(f);
    let big: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    let first = acquire(f, &id, &p).await;
    assert_eq!(begin(f, &first, "charge").await, StepBegin::Fresh);
    f.store
        .finish_step(&first, "charge", Bytes::from_static(b"{\"id\":\"ch_1\"}\0"))
        .await
        .expect("finish_step");
    assert_eq!(
        begin(f, &first, "charge").await,
        StepBegin::Done(Bytes::from_static(b"{\"id\":\"ch_1\"}\0")),
        "a finished step replays its result, even to the attempt that ran it"
    );
    assert_eq!(begin(f, &first, "reserve").await, StepBegin::Fresh);
    f.store
        .finish_step(&first, "reserve", Bytes::from(big.clone()))
        .await
        .expect("finish_step");
    assert_eq!(begin(f, &first, "notify").await, StepBegin::Fresh);
    assert_eq!(
        begin(f, &first, "notify").await,
        StepBegin::Fresh,
        "the attempt's own mark, begun again after a lost answer, is not in doubt"
    );
    f.store.release(&first).await.expect("release");

    let second = acquire(f, &id, &p).await;
    assert_eq!(second.attempt, 2);
    assert_eq!(
        begin(f, &second, "charge").await,
        StepBegin::Done(Bytes::from_static(b"{\"id\":\"ch_1\"}\0")),
        "a released record keeps its journal"
    );
    assert_eq!(
        begin(f, &second, "reserve").await,
        StepBegin::Done(Bytes::from(big.clone()))
    );
    assert_eq!(
        begin(f, &second, "notify").await,
        StepBegin::InDoubt { attempt: 1 },
        "a step started and never finished is in doubt"
    );
    assert_eq!(
        f.store.steps(&id).await.expect("steps"),
        vec![
            StepEntry {
                name: "charge".into(),
                state: done(b"{\"id\":\"ch_1\"}\0"),
            },
            StepEntry {
                name: "notify".into(),
                state: StepState::Started { attempt: 2 },
            },
            StepEntry {
                name: "reserve".into(),
                state: done(&big),
            },
        ],
        "the journal lists every step in name order; beginning in doubt re-marks it"
    );
    f.store
        .finish_step(&second, "notify", Bytes::new())
        .await
        .expect("finish_step");
    f.store
        .complete(&second, Bytes::from_static(b"ok"), LONG)
        .await
        .expect("complete");
    let kept = f.store.steps(&id).await.expect("steps");
    assert_eq!(kept.len(), 3, "a completed record keeps its journal");
    assert_eq!(kept[1].state, done(b""), "an empty result round-trips");
}

/// Every journal write carries the lease's token check: a holder whose
/// lease was taken over, or whose record finished, was deleted or never
/// existed, writes nothing.
pub async fn steps_are_fenced_by_the_lease<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    let id = id(&scope, "k");
    let old = acquire(f, &id, &p).await;
    assert_eq!(begin(f, &old, "a").await, StepBegin::Fresh);
    f.advance(f.lease).await;
    let new = acquire(f, &id, &p).await;
    assert!(new.takeover);
    assert_lease_lost(f.store.begin_step(&old, "b").await, "begin_step");
    assert_lease_lost(
        f.store
            .finish_step(&old, "a", Bytes::from_static(b"1"))
            .await,
        "finish_step",
    );
    assert_eq!(
        begin(f, &new, "a").await,
        StepBegin::InDoubt { attempt: 1 },
        "a takeover keeps the journal and finds the old holder's step in doubt"
    );
    assert_eq!(
        f.store.steps(&id).await.expect("steps"),
        vec![StepEntry {
            name: "a".into(),
            state: StepState::Started { attempt: 2 },
        }],
        "refused writes left nothing behind"
    );
    f.store
        .complete(&new, Bytes::from_static(b"ok"), LONG)
        .await
        .expect("complete");
    assert_lease_lost(
        f.store.begin_step(&new, "c").await,
        "begin_step after complete",
    );
    assert_lease_lost(
        f.store
            .finish_step(&new, "a", Bytes::from_static(b"1"))
            .await,
        "finish_step after complete",
    );

    let gone = RecordId::new(scope.clone(), Key::new("never-claimed").expect("valid"));
    let mut forged = new.clone();
    forged.id = gone.clone();
    assert_lease_lost(
        f.store.begin_step(&forged, "a").await,
        "begin_step on an absent record",
    );
    assert_eq!(f.store.steps(&gone).await.expect("steps"), vec![]);
}

/// The journal lives exactly as long as its record: a record claimed anew
/// after it expired or was deleted starts with an empty journal.
pub async fn a_new_record_starts_with_an_empty_journal<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let short = ClaimParams::new(f.lease, f.lease);
    let expired = id(&scope, "expired");
    let lease = acquire(f, &expired, &short).await;
    assert_eq!(begin(f, &lease, "a").await, StepBegin::Fresh);
    f.store
        .finish_step(&lease, "a", Bytes::from_static(b"1"))
        .await
        .expect("finish_step");
    let deleted = id(&scope, "deleted");
    let lease_d = acquire(f, &deleted, &params(f)).await;
    assert_eq!(begin(f, &lease_d, "a").await, StepBegin::Fresh);
    f.store
        .finish_step(&lease_d, "a", Bytes::from_static(b"1"))
        .await
        .expect("finish_step");
    assert!(f.store.delete(&deleted).await.expect("delete"));
    assert_eq!(f.store.steps(&deleted).await.expect("steps"), vec![]);
    let again = acquire(f, &deleted, &params(f)).await;
    assert_eq!(again.attempt, 1);
    assert_eq!(
        begin(f, &again, "a").await,
        StepBegin::Fresh,
        "a record claimed after a delete has no journal"
    );

    f.advance(f.lease).await;
    assert_eq!(
        f.store.steps(&expired).await.expect("steps"),
        vec![],
        "an expired record's journal reads as empty"
    );
    let renewed = acquire(f, &expired, &short).await;
    assert_eq!((renewed.attempt, renewed.takeover), (1, false));
    assert_eq!(
        begin(f, &renewed, "a").await,
        StepBegin::Fresh,
        "a record claimed after it expired has no journal"
    );
}

/// A parked record (failed, outcome unknown) is resolved by an operator:
/// the finding is journaled and the record released, atomically, so the
/// next claim resumes it. Nothing else can be resolved.
pub async fn parked_records_are_resolved<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let p = params(f);
    for (key, resolution) in [
        (
            "applied",
            Resolution::Applied(Bytes::from_static(b"\"shp_1\"")),
        ),
        ("not-applied", Resolution::NotApplied),
    ] {
        let id = id(&scope, key);
        let lease = acquire(f, &id, &p).await;
        assert_eq!(begin(f, &lease, "reserve").await, StepBegin::Fresh);
        f.store
            .finish_step(&lease, "reserve", Bytes::from_static(b"1"))
            .await
            .expect("finish_step");
        assert_eq!(begin(f, &lease, "ship").await, StepBegin::Fresh);
        assert_eq!(
            f.store
                .resolve_step(&id, "ship", resolution.clone())
                .await
                .expect("resolve"),
            Resolved::NotParked,
            "an in-progress record is not parked"
        );
        let parked = Failure::new(FailureClass::Unknown, "step \"ship\" is in doubt");
        f.store
            .fail(&lease, parked.clone(), LONG)
            .await
            .expect("fail");
        assert_eq!(claim(f, &id, &p).await, ClaimOutcome::Failed(parked));
        for step in ["reserve", "never-started"] {
            assert_eq!(
                f.store
                    .resolve_step(&id, step, resolution.clone())
                    .await
                    .expect("resolve"),
                Resolved::StepNotInDoubt,
                "step {step} is not in doubt"
            );
        }
        assert!(matches!(claim(f, &id, &p).await, ClaimOutcome::Failed(_)));
        assert_eq!(
            f.store
                .resolve_step(&id, "ship", resolution.clone())
                .await
                .expect("resolve"),
            Resolved::Released
        );
        assert_eq!(
            f.store
                .resolve_step(&id, "ship", resolution.clone())
                .await
                .expect("resolve"),
            Resolved::NotParked,
            "a resolved record is no longer parked"
        );
        let next = acquire(f, &id, &p).await;
        assert_eq!((next.attempt, next.takeover), (2, false));
        assert_eq!(
            begin(f, &next, "reserve").await,
            StepBegin::Done(Bytes::from_static(b"1"))
        );
        let ship = begin(f, &next, "ship").await;
        match resolution {
            Resolution::Applied(result) => assert_eq!(ship, StepBegin::Done(result)),
            Resolution::NotApplied => assert_eq!(ship, StepBegin::Fresh),
        }
    }
    let done = id(&scope, "terminal");
    let lease = acquire(f, &done, &p).await;
    assert_eq!(begin(f, &lease, "a").await, StepBegin::Fresh);
    f.store
        .fail(&lease, Failure::new(FailureClass::Terminal, "no"), LONG)
        .await
        .expect("fail");
    assert_eq!(
        f.store
            .resolve_step(&done, "a", Resolution::NotApplied)
            .await
            .expect("resolve"),
        Resolved::NotParked,
        "a terminal failure is not parked"
    );
    let absent = id(&scope, "absent");
    assert_eq!(
        f.store
            .resolve_step(&absent, "a", Resolution::NotApplied)
            .await
            .expect("resolve"),
        Resolved::NotParked
    );
}

/// Journals of different records never mix, under concurrent writers:
/// the same key in two scopes, and the same step names everywhere.
pub async fn journals_are_per_record_under_concurrency<S: ConformanceStore>(f: &Fixture<S>) {
    let scopes = [f.scope("a"), f.scope("b")];
    let p = params(f);
    let mut tasks = Vec::new();
    for scope in &scopes {
        for n in 0..8 {
            let id = id(scope, &format!("k{n}"));
            let lease = acquire(f, &id, &p).await;
            let store = Arc::clone(&f.store);
            let tag = format!("{scope}/{n}");
            tasks.push(tokio::spawn(async move {
                for step in ["one", "two", "three", "four"] {
                    let begun = store.begin_step(&lease, step).await.expect("begin");
                    assert_eq!(begun, StepBegin::Fresh, "{tag} {step}");
                    let result = Bytes::from(format!("{tag}:{step}"));
                    store
                        .finish_step(&lease, step, result)
                        .await
                        .expect("finish");
                }
                (lease.id.clone(), tag)
            }));
        }
    }
    for task in tasks {
        let (id, tag) = task.await.expect("task");
        let steps = f.store.steps(&id).await.expect("steps");
        let want: Vec<StepEntry> = ["four", "one", "three", "two"]
            .iter()
            .map(|step| StepEntry {
                name: (*step).into(),
                state: done(format!("{tag}:{step}").as_bytes()),
            })
            .collect();
        assert_eq!(steps, want, "{id}'s journal holds exactly its own steps");
    }
}

/// `abandoned` finds exactly the live in-progress records of the scope
/// whose lease has run out, longest-abandoned first, up to the limit; a
/// takeover, a live lease, a finished or released record, an expired
/// record and other scopes are not abandoned.
pub async fn abandoned_records_are_found<S: ConformanceStore>(f: &Fixture<S>) {
    let scope = f.scope("a");
    let other = f.scope("b");
    let p = params(f);
    let first = acquire(f, &id(&scope, "first"), &p).await;
    f.advance(Duration::from_millis(5)).await;
    let second = acquire(f, &id(&scope, "second"), &p).await;
    acquire(f, &id(&scope, "live"), &ClaimParams::new(LONG, LONG)).await;
    acquire(f, &id(&scope, "gone"), &ClaimParams::new(f.lease, f.lease)).await;
    let done = acquire(f, &id(&scope, "done"), &p).await;
    f.store
        .complete(&done, Bytes::from_static(b"d"), LONG)
        .await
        .expect("complete");
    let failed = acquire(f, &id(&scope, "failed"), &p).await;
    f.store
        .fail(&failed, Failure::new(FailureClass::Terminal, "x"), LONG)
        .await
        .expect("fail");
    let released = acquire(f, &id(&scope, "released"), &p).await;
    f.store.release(&released).await.expect("release");
    acquire(f, &id(&other, "elsewhere"), &p).await;

    assert!(
        f.store
            .abandoned(&scope, 100)
            .await
            .expect("abandoned")
            .is_empty(),
        "nothing is abandoned while every lease is live"
    );
    f.advance(f.lease).await;

    let found = f.store.abandoned(&scope, 100).await.expect("abandoned");
    let ids: Vec<&str> = found.iter().map(|(id, _)| id.key().as_str()).collect();
    assert_eq!(
        ids,
        ["first", "second"],
        "exactly the run-out leases of the scope, longest-abandoned first"
    );
    for ((_, record), lease) in found.iter().zip([&first, &second]) {
        assert!(
            matches!(record.state, State::InProgress { token, .. } if token == lease.token),
            "an abandoned record is returned as stored: {record:?}"
        );
        assert_eq!(record.attempt, 1);
    }
    let one = f.store.abandoned(&scope, 1).await.expect("abandoned");
    assert_eq!(one.len(), 1, "the limit bounds the answer");

    let taken = acquire(f, &id(&scope, "first"), &p).await;
    assert!(taken.takeover);
    let found = f.store.abandoned(&scope, 100).await.expect("abandoned");
    let ids: Vec<&str> = found.iter().map(|(id, _)| id.key().as_str()).collect();
    assert_eq!(
        ids,
        ["second"],
        "a taken-over record is no longer abandoned"
    );
}

/// For stores with [`RecordTtl`](idem::RecordTtl) (the cache tier's system
/// of record; not part of the suite, called by those stores' tests): the
/// time left is given only for a record completed with exactly the response
/// asked about, so a record deleted and claimed again since its response
/// was read is never cached under the new record's life.
pub async fn record_ttl_follows_the_response<S: ConformanceStore + idem::RecordTtl>(
    f: &Fixture<S>,
) {
    let scope = f.scope("s");
    let p = params(f);
    let id = id(&scope, "ttl");
    assert_eq!(f.store.ttl(&id, b"old").await.expect("ttl"), None, "absent");
    let lease = acquire(f, &id, &p).await;
    assert_eq!(
        f.store.ttl(&id, b"old").await.expect("ttl"),
        None,
        "in progress"
    );
    f.store
        .complete(&lease, Bytes::from_static(b"old"), LONG)
        .await
        .expect("complete");
    let left = f.store.ttl(&id, b"old").await.expect("ttl");
    assert!(
        left.is_some_and(|left| left > LONG - Duration::from_secs(60) && left <= LONG),
        "completed with this response: about its retention left, got {left:?}"
    );
    assert_eq!(
        f.store.ttl(&id, b"other").await.expect("ttl"),
        None,
        "completed with another response"
    );
    assert!(f.store.delete(&id).await.expect("delete"));
    let _new_run = acquire(f, &id, &p).await;
    assert_eq!(
        f.store.ttl(&id, b"old").await.expect("ttl"),
        None,
        "deleted and claimed again: the old response's life is over"
    );
}
