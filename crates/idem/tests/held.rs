//! The held-run form ([`Idempotency::begin`] → [`HeldRun`]): work that is
//! not a closure (another language's handler) keeps its lease while it
//! blocks a thread, is ended by complete, fail or release exactly as the
//! closure form ends a run, and a run dropped unended is taken over as
//! after a crash.

use std::time::Duration;

use idem::{
    Begun, FailureClass, HandlerError, HeldRun, Idempotency, MemoryStore, Outcome, RecordId,
    RunError,
};

type Io = std::io::Error;

fn id(key: &str) -> RecordId {
    RecordId::parse("held", key).expect("valid id")
}

fn executor(lease: Duration) -> Idempotency<MemoryStore> {
    Idempotency::builder(MemoryStore::new())
        .lease(lease)
        .heartbeat(lease / 4)
        .build()
        .expect("config")
}

async fn held(idem: &Idempotency<MemoryStore>, key: &str) -> HeldRun<MemoryStore> {
    match idem.begin::<String, Io>(&id(key), None, None).await {
        Ok(Begun::Held(run)) => *run,
        other => panic!("expected to hold {key}: {other:?}"),
    }
}

/// The work blocks an OS thread for four leases (a handler holding the
/// GIL, a blocked event loop): the heartbeat on the runtime keeps the
/// lease, so a duplicate meanwhile is told the key is in progress, and
/// the completion is stored and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_run_keeps_its_lease_while_its_work_blocks_a_thread() {
    let lease = Duration::from_millis(200);
    let idem = executor(lease);
    let run = held(&idem, "blocked").await;
    let fence = run.context().checked_fence().expect("held");
    let work = std::thread::spawn(move || {
        std::thread::sleep(lease * 4);
        "charged".to_owned()
    });
    for _ in 0..6 {
        tokio::time::sleep(lease / 2).await;
        let duplicate = idem.begin::<String, Io>(&id("blocked"), None, None).await;
        assert!(
            matches!(duplicate, Err(RunError::InProgress { .. })),
            "{duplicate:?}"
        );
    }
    assert!(!run.context().is_lease_lost());
    let value = work.join().expect("work");
    let outcome = run.complete::<_, Io>(value).await.expect("stored");
    assert!(
        matches!(&outcome, Outcome::Executed { value, attempt: 1, .. } if value == "charged"),
        "{outcome:?}"
    );
    assert_eq!(fence, 1);
    let again = idem.begin::<String, Io>(&id("blocked"), None, None).await;
    assert!(
        matches!(&again, Ok(Begun::Replayed(value)) if value == "charged"),
        "{again:?}"
    );
}

/// A run dropped without being ended is left as a crash leaves it: its
/// lease runs out, the next claim takes it over as attempt 2, and the
/// dropped run's context knows its lease is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_run_is_taken_over_after_its_lease() {
    let lease = Duration::from_millis(200);
    let idem = executor(lease);
    let run = held(&idem, "dropped").await;
    let ctx = run.context().clone();
    drop(run);
    let early = idem.begin::<String, Io>(&id("dropped"), None, None).await;
    assert!(
        matches!(early, Err(RunError::InProgress { .. })),
        "{early:?}"
    );
    tokio::time::sleep(lease + lease / 2).await;
    assert!(ctx.is_lease_lost(), "no heartbeat after the drop");
    let again = held(&idem, "dropped").await;
    assert_eq!(again.context().attempt(), 2);
    assert!(again.context().is_takeover());
    assert_eq!(again.context().fence(), Some(2));
}

/// `fail` classifies and records as the closure form does: a terminal
/// error is replayed to every later claim; a retryable one frees the key
/// for the next attempt, with the backoff to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_and_recorded_as_the_closure_form_does() {
    let idem = executor(Duration::from_secs(5));
    let run = held(&idem, "declined").await;
    let error = run.fail(HandlerError::terminal("card declined")).await;
    assert!(
        matches!(
            &error,
            RunError::Handler {
                class: FailureClass::Terminal,
                attempt: 1,
                ..
            }
        ),
        "{error:?}"
    );
    let replayed = idem.begin::<String, Io>(&id("declined"), None, None).await;
    let Err(RunError::Failed(failure)) = replayed else {
        panic!("{replayed:?}")
    };
    assert_eq!(failure.message, "card declined");

    let run = held(&idem, "flaky").await;
    let error = run.fail(Io::other("downstream reset")).await;
    assert!(
        matches!(
            &error,
            RunError::Handler {
                class: FailureClass::Retryable,
                retry_after: Some(_),
                ..
            }
        ),
        "{error:?}"
    );
    let retried = held(&idem, "flaky").await;
    assert_eq!(retried.context().attempt(), 2);
}

/// `release` frees the key at once with nothing recorded: the next claim
/// runs it, with the next fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_run_is_claimable_at_once() {
    let idem = executor(Duration::from_secs(30));
    let run = held(&idem, "released").await;
    run.release().await.expect("released");
    let again = held(&idem, "released").await;
    assert_eq!(again.context().fence(), Some(2));
    let outcome = again.complete::<_, Io>("done".to_owned()).await;
    assert!(
        matches!(outcome, Ok(Outcome::Executed { .. })),
        "{outcome:?}"
    );
}

/// Concurrent begins of one key from many tasks: exactly one holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_begins_hold_a_key_once() {
    let idem = executor(Duration::from_secs(30));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let begins: Vec<_> = (0..16)
        .map(|_| {
            let (idem, barrier) = (idem.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                idem.begin::<String, Io>(&id("raced"), None, None).await
            })
        })
        .collect();
    let mut holders = Vec::new();
    for begun in begins {
        match begun.await.expect("task") {
            Ok(Begun::Held(run)) => holders.push(run),
            Err(RunError::InProgress { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(holders.len(), 1);
}
