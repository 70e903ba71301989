//! The step journal: steps marked before they run, journaled when they
//! finish, fenced by the lease, and resolved by an operator.

pub use super::layouts::step_layouts_replay_and_sealed_steps_show_nothing;

use std::sync::Arc;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease, StepBegin};
use idem::{
    Failure, FailureClass, Key, RecordId, Resolution, Resolved, State, StepEntry, StepState,
};

use super::{acquire, assert_lease_lost, claim, done, id, params, Fixture, Steps, LONG};

/// The optional capabilities the store implements reach the executor
/// through its `Store` impl: a store that implements [`StepJournal`](idem::StepJournal) and
/// [`idem::GetRecord`] but does not name them in
/// [`idem::store_capabilities!`] compiles, and fails here (the executor
/// would refuse every step and treat every lost answer as unknown).
pub async fn capabilities_reach_the_executor<S: Steps>(f: &Fixture<S>) {
    let id = id(&f.scope("s"), "k");
    let lease = acquire(f, &id, &params(f)).await;
    let journal = f.store.step_journal().expect(
        "Store::step_journal is None although the store implements StepJournal: \
         name `steps` in store_capabilities!",
    );
    assert_eq!(
        journal
            .begin_step(&lease, "wired")
            .await
            .expect("begin_step"),
        StepBegin::Fresh
    );
    journal
        .finish_step(
            &lease,
            "wired",
            Bytes::from_static(b"through the executor's journal"),
        )
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

async fn begin<S: Steps>(f: &Fixture<S>, lease: &Lease, step: &str) -> StepBegin {
    f.store.begin_step(lease, step).await.expect("begin_step")
}

/// A step is marked started before it runs and journaled when it
/// finishes; a finished step is replayed to later attempts (byte for
/// byte), and a step left started is reported in doubt with the attempt
/// that started it — to a later attempt only: the same attempt beginning
/// it again is retrying a `begin_step` whose answer was lost, and the
/// step has not run (docs/design.md §7).
pub async fn steps_are_journaled_and_replayed<S: Steps>(f: &Fixture<S>) {
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
pub async fn steps_are_fenced_by_the_lease<S: Steps>(f: &Fixture<S>) {
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
pub async fn a_new_record_starts_with_an_empty_journal<S: Steps>(f: &Fixture<S>) {
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
pub async fn parked_records_are_resolved<S: Steps>(f: &Fixture<S>) {
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
pub async fn journals_are_per_record_under_concurrency<S: Steps>(f: &Fixture<S>) {
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
