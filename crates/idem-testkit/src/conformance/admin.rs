//! Administration: delete, list, purge and finding abandoned records, and
//! fences that keep rising across delete and purge.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease, LeaseToken};
use idem::{Failure, FailureClass, ListQuery, State, StateKind};

use super::{
    acquire, assert_lease_lost, claim, id, params, records_in_every_state, Admin, Fixture, LONG,
};

/// The longest lease and retention the API accepts (`Duration::MAX`,
/// "forever") are held as such: the claim stands (a second claim finds it
/// in progress, not acquired again), the lease extends, and the completed
/// or failed record is replayed and outlives any purge.
pub async fn the_longest_durations_are_held<S: Admin>(f: &Fixture<S>) {
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

/// Tokens never repeat and fences only rise, across release, delete and
/// expiry of the record.
pub async fn tokens_are_never_reused<S: Admin>(f: &Fixture<S>) {
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

/// Purge removes expired records and nothing else, in bounded batches.
pub async fn purge_removes_only_expired<S: Admin>(f: &Fixture<S>) {
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
pub async fn delete_force_releases<S: Admin>(f: &Fixture<S>) {
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
pub async fn list_by_state_and_scope<S: Admin>(f: &Fixture<S>) {
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

/// `abandoned` finds exactly the live in-progress records of the scope
/// whose lease has run out, longest-abandoned first, up to the limit; a
/// takeover, a live lease, a finished or released record, an expired
/// record and other scopes are not abandoned.
pub async fn abandoned_records_are_found<S: Admin>(f: &Fixture<S>) {
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

/// An expired record is not listed, before any purge, whatever its state.
pub async fn expired_records_are_not_listed<S: Admin>(f: &Fixture<S>) {
    let scope = f.scope("s");
    records_in_every_state(f, &scope, &ClaimParams::new(f.lease, f.lease)).await;
    let listed = f
        .store
        .list(&ListQuery::new(10).scope(scope.clone()))
        .await
        .expect("list");
    assert_eq!(listed.records.len(), 4, "the live records are listed");
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
}
