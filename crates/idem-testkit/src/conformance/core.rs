//! The core cases: a claim and the writes of its holder, one key at a time
//! (the primitives, and reading a record back).

pub use super::layouts::{earlier_response_layouts_replay, sealed_responses_show_nothing};

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Failure, FailureClass, Fingerprint, State};

use super::{
    acquire, assert_every_write_rejected, assert_lease_lost, claim, counting, id, params,
    records_in_every_state, Core, Fixture, LONG,
};

/// Claim, complete, and every later claim replays the stored bytes.
pub async fn claim_complete_replay<S: Core>(f: &Fixture<S>) {
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

/// A live record binds its key to its fingerprint in every state.
pub async fn mismatch_is_refused_in_every_live_state<S: Core>(f: &Fixture<S>) {
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
pub async fn live_lease_reports_retry_after<S: Core>(f: &Fixture<S>) {
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
pub async fn expired_lease_is_taken_over<S: Core>(f: &Fixture<S>) {
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
pub async fn finished_records_reject_every_write<S: Core>(f: &Fixture<S>) {
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
pub async fn stale_token_is_rejected_by_every_write<S: Core>(f: &Fixture<S>) {
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

/// An expired record is absent on read, before any purge, whatever its
/// state: it is neither read, nor replayed, nor bound to its fingerprint,
/// nor taken over (and not listed: `admin::expired_records_are_not_listed`).
pub async fn expiry_is_honoured_at_read_time<S: Core>(f: &Fixture<S>) {
    let scope = f.scope("s");
    let a = ClaimParams::new(f.lease, f.lease).fingerprint(Fingerprint::of_bytes(b"a"));
    let b = ClaimParams::new(f.lease, f.lease).fingerprint(Fingerprint::of_bytes(b"b"));
    records_in_every_state(f, &scope, &a).await;
    f.advance(f.lease).await;
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
pub async fn peek_reads_without_claiming<S: Core>(f: &Fixture<S>) {
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
pub async fn released_record_is_reclaimed<S: Core>(f: &Fixture<S>) {
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
pub async fn failures_are_classified<S: Core>(f: &Fixture<S>) {
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
pub async fn extend_keeps_the_lease<S: Core>(f: &Fixture<S>) {
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

/// Arbitrary response bytes and failure text survive storage unchanged.
pub async fn stored_bytes_round_trip<S: Core>(f: &Fixture<S>) {
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
pub async fn calls_yield_to_the_runtime<S: Core>(f: &Fixture<S>) {
    let scope = f.scope("yield");
    let p = params(f);
    let yielded = std::cell::Cell::new(0usize);
    let mut polls = |pending: bool| yielded.set(yielded.get() + usize::from(pending));
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
        // One yield answers the question: a networked store yields on
        // its first call, and need not make the other 1,999 (on DynamoDB
        // under moto, a minute of the suite).
        if yielded.get() > 0 {
            break;
        }
    }
    assert!(
        yielded.get() > 0,
        "2,000 store calls in one task never yielded to the runtime: a task \
         looping over this store would starve everything else on its worker"
    );
}
