//! `Context::step` through the executor on the memory store: steps run
//! once across attempts, in-doubt policies, and every typed error. (The
//! same journal on the networked stores is proven by the conformance
//! suite, and against killed worker processes in idem-postgres.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::step::{downstream_key, Park, Retry, Skip, StepError};
use idem::store::{ClaimOutcome, ClaimParams, Lease, StepBegin};
use idem::{
    Failure, FailureClass, Idempotency, ManualClock, MemoryStore, RecordId, Resolution, Resolved,
    RunError, StepJournal, Store, StoreError, Timestamp,
};
use idem_testkit::doubles::{Double, NoJournal};

type Io = std::io::Error;

#[derive(Debug, thiserror::Error)]
enum HandlerError {
    #[error(transparent)]
    Step(#[from] StepError<Io>),
    #[error("transient")]
    Transient,
}

fn id(key: &str) -> RecordId {
    RecordId::parse("orders", key).expect("valid")
}

fn setup() -> (
    ManualClock,
    MemoryStore<ManualClock>,
    Idempotency<MemoryStore<ManualClock>>,
) {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(10))
        .max_response_bytes(4096)
        .build()
        .expect("config");
    (clock, store, idem)
}

/// A worker that crashed inside step `step`: claimed, began the step, and
/// vanished; the lease is then left to run out.
async fn crashed_inside(
    store: &MemoryStore<ManualClock>,
    clock: &ManualClock,
    id: &RecordId,
    done: &[(&str, &[u8])],
    step: &str,
) -> Lease {
    let params = ClaimParams::new(Duration::from_secs(10), Duration::from_secs(3600));
    let ClaimOutcome::Acquired(lease) = store.claim(id, &params).await.expect("claim") else {
        panic!("fresh key");
    };
    for (name, result) in done {
        assert_eq!(
            store.begin_step(&lease, name).await.expect("begin"),
            StepBegin::Fresh
        );
        store
            .finish_step(&lease, name, Bytes::copy_from_slice(result))
            .await
            .expect("finish");
    }
    assert_eq!(
        store.begin_step(&lease, step).await.expect("begin"),
        StepBegin::Fresh
    );
    clock.advance(Duration::from_secs(11));
    lease
}

#[tokio::test]
async fn finished_steps_are_replayed_and_never_rerun() {
    let (_, _, idem) = setup();
    let runs = [AtomicU32::new(0), AtomicU32::new(0)];
    let id = id("o-1");
    for attempt in 1..=2 {
        let runs = &runs;
        let result = idem
            .run(&id, None, |ctx| async move {
                let a: String = ctx
                    .step("a", Retry, |s| async move {
                        runs[0].fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Io>(s.key().to_owned())
                    })
                    .await?;
                if attempt == 1 {
                    return Err(HandlerError::Transient);
                }
                let b: u32 = ctx
                    .step("b", Retry, |_| async {
                        runs[1].fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Io>(7)
                    })
                    .await?;
                Ok::<_, HandlerError>((a, b))
            })
            .await;
        if attempt == 1 {
            assert!(matches!(
                result,
                Err(RunError::Handler {
                    class: FailureClass::Retryable,
                    ..
                })
            ));
        } else {
            let (a, b) = result.expect("second attempt completes").into_value();
            assert_eq!(
                a,
                downstream_key(&id, "a"),
                "the journaled result is replayed"
            );
            assert_eq!(b, 7);
        }
    }
    assert_eq!(
        runs[0].load(Ordering::SeqCst),
        1,
        "step a ran once across two attempts"
    );
    assert_eq!(runs[1].load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_step_in_doubt_follows_its_policy() {
    let (clock, store, idem) = setup();
    let ran = AtomicU32::new(0);
    let ran = &ran;

    // Retry: runs again, told it is in doubt, under the same key.
    let retry = id("retry");
    crashed_inside(&store, &clock, &retry, &[], "charge").await;
    let out = idem
        .run(&retry, None, |ctx| async move {
            let seen: (bool, String, u32) = ctx
                .step("charge", Retry, |s| async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Io>((s.in_doubt(), s.key().to_owned(), s.attempt()))
                })
                .await?;
            Ok::<_, HandlerError>(seen)
        })
        .await
        .expect("completes")
        .into_value();
    assert_eq!(out, (true, downstream_key(&retry, "charge"), 2));
    assert_eq!(ran.swap(0, Ordering::SeqCst), 1);

    // Skip: does not run; None; journaled as skipped.
    let skip = id("skip");
    crashed_inside(&store, &clock, &skip, &[], "email").await;
    let out = idem
        .run(&skip, None, |ctx| async move {
            let sent: Option<()> = ctx
                .step("email", Skip, |_| async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Io>(())
                })
                .await?;
            Ok::<_, HandlerError>(sent.is_some())
        })
        .await
        .expect("completes")
        .into_value();
    assert!(!out, "a skipped step returns None");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "a Skip step in doubt never runs"
    );
    assert_eq!(
        store.steps(&skip).await.expect("steps")[0].state,
        idem::StepState::Done {
            result: Bytes::new()
        }
    );

    // Park: does not run; the record is parked whatever the handler says.
    let park = id("park");
    crashed_inside(&store, &clock, &park, &[("reserve", b"1")], "ship").await;
    let handler = |ctx: idem::Context| async move {
        let reserved: u32 = ctx
            .step("reserve", Retry, |_| async { Ok::<_, Io>(99) })
            .await?;
        let shipment: String = match ctx
            .step("ship", Park, |_| async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Io>("shp_new".to_owned())
            })
            .await
        {
            Err(StepError::Parked { attempt: 1, .. }) => "ignored the park".to_owned(),
            other => other?,
        };
        Ok::<_, HandlerError>((reserved, shipment))
    };
    match idem.run(&park, None, handler).await {
        Err(RunError::Parked(f)) => {
            assert_eq!(f.class, FailureClass::Unknown);
            assert!(f.message.contains("\"ship\""), "{}", f.message);
        }
        other => panic!("expected a park, got {other:?}"),
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "a Park step in doubt never runs"
    );
    assert!(
        matches!(
            idem.run(&park, None, handler).await,
            Err(RunError::Failed(Failure {
                class: FailureClass::Unknown,
                ..
            }))
        ),
        "a parked record replays its unknown outcome"
    );

    assert_eq!(
        store
            .resolve_step(
                &park,
                "ship",
                Resolution::Applied(Bytes::from_static(b"\"shp_1\""))
            )
            .await
            .expect("resolve"),
        Resolved::Released
    );
    let out = idem
        .run(&park, None, handler)
        .await
        .expect("resumes")
        .into_value();
    assert_eq!(
        out,
        (1, "shp_1".to_owned()),
        "both steps replay their journaled results"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn bad_steps_get_typed_errors_and_run_nothing() {
    let (_, _, idem) = setup();
    let ran = AtomicU32::new(0);
    let ran = &ran;
    let work = |_| async {
        ran.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Io>(1u8)
    };
    let id = id("bad");
    let result = idem
        .run(&id, None, |ctx| async move {
            let invalid = ctx.step("has space", Retry, work).await;
            assert!(
                matches!(&invalid, Err(StepError::InvalidName { problem, .. }) if problem.contains("visible ASCII")),
                "{invalid:?}"
            );
            let long = "x".repeat(129);
            assert!(matches!(ctx.step(&long, Retry, work).await, Err(StepError::InvalidName { .. })));
            assert!(matches!(ctx.step("", Retry, work).await, Err(StepError::InvalidName { .. })));
            ctx.step("once", Retry, work).await?;
            let again = ctx.step("once", Retry, work).await;
            assert!(matches!(again, Err(StepError::DuplicateName { .. })), "{again:?}");
            let big = ctx
                .step("big", Retry, |_| async { Ok::<_, Io>("x".repeat(5000)) })
                .await;
            assert!(
                matches!(&big, Err(StepError::Encode { reason, .. }) if reason.contains("limit")),
                "{big:?}"
            );
            let failed = ctx
                .step("fails", Retry, |_| async { Err::<u8, _>(Io::other("refused")) })
                .await;
            assert!(matches!(failed, Err(StepError::Failed { .. })));
            Ok::<_, HandlerError>(())
        })
        .await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "only the valid, first `once` ran"
    );
    let journal = idem.store().steps(&id).await.expect("steps");
    let names: Vec<&str> = journal.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["big", "fails", "once"],
        "oversize and failed steps stay started"
    );
}

#[tokio::test]
async fn a_changed_result_type_or_policy_is_a_decode_error() {
    let (clock, store, idem) = setup();
    let key = id("changed");
    crashed_inside(&store, &clock, &key, &[("n", b"\"text\"")], "skipped").await;
    let params = ClaimParams::new(Duration::from_secs(10), Duration::from_secs(3600));
    let ClaimOutcome::Acquired(lease) = store.claim(&key, &params).await.expect("claim") else {
        panic!("takeover");
    };
    store
        .finish_step(&lease, "skipped", Bytes::new())
        .await
        .expect("finish");
    store.release(&lease).await.expect("release");
    idem.run(&key, None, |ctx| async move {
        let n = ctx.step("n", Retry, |_| async { Ok::<u32, Io>(1) }).await;
        assert!(matches!(n, Err(StepError::Decode { .. })), "{n:?}");
        let s = ctx
            .step("skipped", Retry, |_| async { Ok::<u32, Io>(1) })
            .await;
        assert!(
            matches!(&s, Err(StepError::Decode { reason, .. }) if reason.contains("skipped")),
            "{s:?}"
        );
        Ok::<_, HandlerError>(())
    })
    .await
    .expect("handler ran");
}

#[tokio::test]
async fn a_holder_whose_lease_was_taken_over_cannot_journal() {
    let (clock, store, _) = setup();
    let key = id("taken");
    let old = crashed_inside(&store, &clock, &key, &[], "a").await;
    let params = ClaimParams::new(Duration::from_secs(10), Duration::from_secs(3600));
    let ClaimOutcome::Acquired(new) = store.claim(&key, &params).await.expect("claim") else {
        panic!("takeover");
    };
    assert!(new.takeover);
    assert!(matches!(
        store.finish_step(&old, "a", Bytes::from_static(b"1")).await,
        Err(StoreError::LeaseLost)
    ));
    assert_eq!(
        store.begin_step(&new, "a").await.expect("begin"),
        StepBegin::InDoubt { attempt: 1 }
    );
}

#[tokio::test]
async fn a_store_without_a_journal_refuses_steps() {
    let idem = Idempotency::builder(Double::new(MemoryStore::new(), NoJournal))
        .build()
        .expect("config");
    let ran = AtomicU32::new(0);
    let ran = &ran;
    let result = idem
        .run(&id("plain"), None, |ctx| async move {
            ctx.step("a", Retry, |_| async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Io>(())
            })
            .await?;
            Ok::<_, HandlerError>(())
        })
        .await;
    assert!(
        matches!(
            &result,
            Err(RunError::Handler {
                error: HandlerError::Step(StepError::Unsupported { .. }),
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The memory store, except that the first `begin_step` is applied and its
/// answer lost (the caller sees `Unavailable` and retries).
#[derive(Clone, Default)]
struct LostBeginAnswer {
    store: MemoryStore,
    lost: Arc<std::sync::atomic::AtomicBool>,
}

impl Store for LostBeginAnswer {
    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        self.store.claim(id, params).await
    }
    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        keep: Duration,
    ) -> Result<(), StoreError> {
        self.store.complete(lease, response, keep).await
    }
    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        keep: Duration,
    ) -> Result<(), StoreError> {
        self.store.fail(lease, failure, keep).await
    }
    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        self.store.extend(lease, duration).await
    }
    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.store.release(lease).await
    }
    fn step_journal(&self) -> Option<Arc<dyn idem::store::DynStepJournal>> {
        Some(idem::store::journal_of(self.clone()))
    }
}

impl StepJournal for LostBeginAnswer {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let begun = self.store.begin_step(lease, step).await?;
        if !self.lost.swap(true, Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the answer was lost".into()));
        }
        Ok(begun)
    }
    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        self.store.finish_step(lease, step, result).await
    }
    async fn steps(&self, id: &RecordId) -> Result<Vec<idem::StepEntry>, StoreError> {
        self.store.steps(id).await
    }
    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        self.store.resolve_step(id, step, resolution).await
    }
}

/// A `begin_step` whose answer is lost is retried; the retry finds the
/// attempt's own mark, which is not a step in doubt: under `Skip` the step
/// still runs (once) and its result is journaled, instead of being
/// recorded as skipped with its effect lost.
#[tokio::test]
async fn a_lost_begin_step_answer_does_not_put_the_step_in_doubt() {
    let store = LostBeginAnswer::default();
    let idem = Idempotency::builder(store.clone()).build().expect("config");
    let ran = AtomicU32::new(0);
    let ran = &ran;
    let outcome = idem
        .run(&id("lost-answer"), None, |ctx| async move {
            let charged = ctx
                .step("charge", Skip, |_| async {
                    ran.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Io>("ch_1".to_owned())
                })
                .await?;
            Ok::<_, HandlerError>(charged)
        })
        .await
        .expect("executed");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the step ran once");
    assert!(
        matches!(outcome, idem::Outcome::Executed { value: Some(ref id), .. } if id == "ch_1"),
        "{outcome:?}"
    );
    let steps = store.store.steps(&id("lost-answer")).await.expect("steps");
    assert_eq!(
        steps.first().map(|s| &s.state),
        Some(&idem::StepState::Done {
            result: Bytes::from_static(b"\"ch_1\"")
        })
    );
}
