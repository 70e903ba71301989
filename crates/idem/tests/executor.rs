//! The executor over the real in-memory store: once-only execution among
//! concurrent duplicates, heartbeats, lease loss, retries, limits, and
//! fail-closed behaviour.
//!
//! Timing cases run on tokio's paused clock with a store clock driven by
//! it, so "wait 10 s" takes no real time and nothing is timing-sensitive.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{
    DeleteRecord, Failure, FailureClass, Fingerprint, GetRecord, Idempotency, MemoryStore, Outcome,
    RecordId, RunError, State, Store, StoreError, Terminal, Timestamp,
};
use idem_testkit::doubles::{Double, Hooks};
use idem_testkit::{DownStore, TokioClock};

fn paused_store() -> MemoryStore<TokioClock> {
    MemoryStore::builder().clock(TokioClock::new()).build()
}

fn id(key: &str) -> RecordId {
    RecordId::parse("tests", key).expect("valid id")
}

type Io = std::io::Error;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_execute_once() {
    let idem = Idempotency::builder(MemoryStore::new())
        .build()
        .expect("config");
    let runs = Arc::new(AtomicU32::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (idem, runs, barrier) = (idem.clone(), Arc::clone(&runs), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                idem.run(&id("dup"), None, |_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, Io>(7u32)
                })
                .await
            })
        })
        .collect();
    let mut executed = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(Outcome::Executed { value: 7, .. }) => executed += 1,
            Ok(Outcome::Replayed { value: 7 }) | Err(RunError::InProgress { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_duplicates_all_get_the_one_result() {
    let idem = Idempotency::builder(MemoryStore::new())
        .wait_for_in_flight(Duration::from_secs(30))
        .build()
        .expect("config");
    let runs = Arc::new(AtomicU32::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (idem, runs, barrier) = (idem.clone(), Arc::clone(&runs), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                idem.run(&id("wait"), None, |_| async {
                    let n = runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, Io>(format!("result of run {n}"))
                })
                .await
            })
        })
        .collect();
    let mut executed = 0;
    for task in tasks {
        let outcome = task
            .await
            .expect("task")
            .expect("every duplicate gets the result");
        assert_eq!(outcome.value(), "result of run 0");
        if !outcome.is_replayed() {
            executed += 1;
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn heartbeat_keeps_a_long_handler_exclusive() {
    let store = paused_store();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(3))
        .build()
        .expect("config");
    let runs = Arc::new(AtomicU32::new(0));
    let slow = {
        let (idem, runs) = (idem.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            idem.run(&id("long"), None, |ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(10)).await;
                assert!(!ctx.is_lease_lost(), "heartbeats kept the lease");
                Ok::<_, Io>(1u8)
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let dup = idem
        .run(&id("long"), None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Io>(2u8)
        })
        .await;
    assert!(
        matches!(dup, Err(RunError::InProgress { .. })),
        "past the original lease, the heartbeat still holds the key: {dup:?}"
    );
    let first = slow.await.expect("task").expect("run");
    assert_eq!(
        first,
        Outcome::Executed {
            value: 1,
            attempt: 1,
            takeover: false
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn heartbeats_are_reported_while_the_lease_is_held_and_stop_when_it_is_lost() {
    let store = paused_store();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(3))
        .heartbeat(Duration::from_secs(1))
        .build()
        .expect("config");
    let beats = Arc::new(AtomicU32::new(0));
    let run = {
        let (idem, beats) = (idem.clone(), Arc::clone(&beats));
        tokio::spawn(async move {
            idem.run(&id("beats"), None, |ctx| async move {
                let mut heartbeats = ctx.heartbeats();
                let counting = async {
                    loop {
                        heartbeats.next().await;
                        beats.fetch_add(1, Ordering::SeqCst);
                    }
                };
                tokio::select! {
                    never = counting => never,
                    () = ctx.lease_lost() => {}
                }
                Ok::<_, Io>(())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(
        beats.load(Ordering::SeqCst),
        4,
        "one report per confirmed extension, at 1 s, 2 s, 3 s and 4 s"
    );
    assert!(store.delete(&id("beats")).await.expect("force release"));
    let result = run.await.expect("task");
    assert!(matches!(result, Err(RunError::LeaseLost)), "{result:?}");
    assert_eq!(
        beats.load(Ordering::SeqCst),
        4,
        "the failed extension is not reported as a heartbeat"
    );
}

#[tokio::test(start_paused = true)]
async fn lost_lease_is_signalled_and_the_stale_result_is_not_stored() {
    let store = paused_store();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(3))
        .build()
        .expect("config");
    let run = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.run(&id("lost"), None, |ctx| async move {
                ctx.lease_lost().await;
                assert!(ctx.ensure_lease().is_err());
                Ok::<_, Io>("stale".to_owned())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(store.delete(&id("lost")).await.expect("force release"));
    let result = run.await.expect("task");
    assert!(matches!(result, Err(RunError::LeaseLost)), "{result:?}");
    assert_eq!(
        store.get(&id("lost")).await.expect("get"),
        None,
        "the stale holder stored nothing"
    );
}

/// A handler whose process stalls past its lease (a blocking call, a
/// pause, a starved machine) must not be told the lease is held when it
/// resumes: the heartbeat has had no chance to run and flag it, so the
/// check itself looks at the clock. On the old code, `ensure_lease`
/// answered `Ok` here while another worker could already have taken over.
#[tokio::test]
async fn a_stall_past_the_lease_is_seen_before_the_heartbeat_runs() {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::from_millis(300))
        .build()
        .expect("config");
    let seen = idem
        .run(&id("stalled"), None, |ctx| async move {
            let before = (ctx.ensure_lease().is_ok(), ctx.checked_fence().is_ok());
            std::thread::sleep(Duration::from_millis(450));
            let after = (ctx.is_lease_lost(), ctx.ensure_lease().is_err());
            Ok::<_, Io>((before, after, ctx.checked_fence().is_err()))
        })
        .await;
    let (before, after, fence_refused) = match seen {
        Ok(receipt) => receipt.into_value(),
        Err(RunError::LeaseLost) => panic!("the run ended before its handler could look"),
        Err(other) => panic!("{other:?}"),
    };
    assert_eq!(before, (true, true), "held while the lease ran");
    assert_eq!(after, (true, true), "lost once the lease ran out");
    assert!(fence_refused, "no fence for a lost lease");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_run_leaves_the_record_to_expire_then_a_takeover_runs() {
    let store = paused_store();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(3))
        .build()
        .expect("config");
    let crashed = tokio::time::timeout(
        Duration::from_secs(1),
        idem.run(&id("crash"), None, |_| {
            std::future::pending::<Result<u8, Io>>()
        }),
    )
    .await;
    assert!(crashed.is_err(), "the run was cut off mid-handler");
    let params = ClaimParams::new(Duration::from_secs(3), Duration::from_secs(60));
    assert!(matches!(
        store.claim(&id("crash"), &params).await.expect("claim"),
        ClaimOutcome::InProgress { .. }
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let retried = idem
        .run(&id("crash"), None, |ctx| async move {
            assert!(ctx.is_takeover());
            Ok::<_, Io>(ctx.attempt())
        })
        .await
        .expect("takeover runs");
    assert_eq!(
        retried,
        Outcome::Executed {
            value: 2,
            attempt: 2,
            takeover: true
        }
    );
}

#[tokio::test]
async fn retryable_failures_back_off_until_max_attempts_make_them_terminal() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_attempts(NonZeroU32::new(3).expect("non-zero"))
        .build()
        .expect("config");
    let runs = AtomicU32::new(0);
    let key = id("poison");
    let attempt = || {
        idem.run(&key, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<u8, _>(Io::other("downstream timeout"))
        })
    };
    for n in 1..=2 {
        match attempt().await {
            Err(RunError::Handler {
                class: FailureClass::Retryable,
                attempt,
                retry_after: Some(d),
                ..
            }) => {
                assert_eq!(attempt, n);
                assert!(!d.is_zero());
            }
            other => panic!("attempt {n}: {other:?}"),
        }
    }
    match attempt().await {
        Err(RunError::Handler {
            class: FailureClass::Terminal,
            attempt: 3,
            retry_after: None,
            ..
        }) => {}
        other => panic!("attempt 3 must be terminal: {other:?}"),
    }
    match attempt().await {
        Err(RunError::Failed(Failure {
            class: FailureClass::Terminal,
            message,
        })) => {
            assert_eq!(message, "attempts exhausted (3 of 3): downstream timeout");
        }
        other => panic!("a poison message is replayed as failed: {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn terminal_errors_are_replayed_not_retried() {
    let idem = Idempotency::builder(MemoryStore::new())
        .build()
        .expect("config");
    let runs = AtomicU32::new(0);
    for _ in 0..3 {
        let result = idem
            .run(&id("declined"), None, |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err::<u8, _>(Terminal::new("card declined"))
            })
            .await;
        assert!(matches!(
            result,
            Err(RunError::Handler {
                class: FailureClass::Terminal,
                ..
            }) | Err(RunError::Failed(Failure {
                class: FailureClass::Terminal,
                ..
            }))
        ));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_custom_classifier_decides() {
    let idem = Idempotency::builder(MemoryStore::new())
        .classify(|e| {
            if e.to_string().contains("422") {
                FailureClass::Terminal
            } else {
                FailureClass::Retryable
            }
        })
        .build()
        .expect("config");
    let result = idem
        .run(&id("custom"), None, |_| async {
            Err::<u8, _>(Io::other("HTTP 422"))
        })
        .await;
    assert!(matches!(
        result,
        Err(RunError::Handler {
            class: FailureClass::Terminal,
            ..
        })
    ));
}

#[tokio::test]
async fn oversize_responses_are_a_clear_error_and_never_rerun() {
    let idem = Idempotency::builder(MemoryStore::new())
        .max_response_bytes(100)
        .build()
        .expect("config");
    let runs = AtomicU32::new(0);
    let key = id("big");
    let run = || {
        idem.run(&key, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Io>("x".repeat(1000))
        })
    };
    match run().await {
        Err(RunError::ResponseTooLarge {
            size: 1002,
            limit: 100,
        }) => {}
        other => panic!("{other:?}"),
    }
    match run().await {
        Err(RunError::Failed(f)) => assert!(
            f.message.contains("exceeds the limit of 100 bytes"),
            "{}",
            f.message
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the effect happened once; it must not run again"
    );
}

#[tokio::test]
async fn large_responses_are_stored_compressed_and_replayed_exactly() {
    let store = MemoryStore::new();
    let idem = Idempotency::builder(store.clone())
        .compress_above(64)
        .build()
        .expect("config");
    let body: Vec<String> = (0..500).map(|i| format!("line {}", i % 10)).collect();
    let first = idem
        .run(&id("zip"), None, |_| async { Ok::<_, Io>(body.clone()) })
        .await
        .expect("run");
    assert!(!first.is_replayed());
    let Some(record) = store.get(&id("zip")).await.expect("get") else {
        panic!("stored")
    };
    let State::Completed { response } = record.state else {
        panic!("completed")
    };
    let plain = serde_json::to_vec(&body).expect("json").len();
    assert_eq!(response[0], 1, "zstd envelope");
    assert!(
        response.len() * 10 < plain,
        "{} stored bytes for {plain} encoded",
        response.len()
    );
    let again = idem
        .run(&id("zip"), None, |_| async {
            Ok::<Vec<String>, Io>(Vec::new())
        })
        .await
        .expect("replay");
    assert_eq!(again, Outcome::Replayed { value: body });
}

#[tokio::test]
async fn mismatched_fingerprints_and_wrong_types_are_typed_errors() {
    let idem = Idempotency::builder(MemoryStore::new())
        .build()
        .expect("config");
    let a = Fingerprint::of_json(br#"{"amount":1}"#).expect("json");
    let b = Fingerprint::of_json(br#"{"amount":2}"#).expect("json");
    idem.run(&id("fp"), Some(a), |_| async { Ok::<_, Io>(5u64) })
        .await
        .expect("run");
    let mismatch = idem
        .run(&id("fp"), Some(b), |_| async { Ok::<_, Io>(6u64) })
        .await;
    assert!(matches!(mismatch, Err(RunError::Mismatch)));
    let wrong = idem
        .run(&id("fp"), Some(a), |_| async { Ok::<_, Io>(String::new()) })
        .await;
    match wrong {
        Err(RunError::Decode { reason }) => {
            assert!(reason.contains("expected a string"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn fail_closed_by_default_fail_open_when_asked() {
    let runs = AtomicU32::new(0);
    let handler = |ctx: idem::Context| {
        let runs = &runs;
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Io>(ctx.lease().is_some())
        }
    };
    let closed = Idempotency::builder(DownStore).build().expect("config");
    let result = closed.run(&id("down"), None, handler).await;
    match &result {
        Err(e @ RunError::Store(StoreError::Unavailable(_))) => {
            assert_eq!(e.retry_after(), Some(idem::STORE_RETRY_AFTER))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "fail-closed: the handler did not run"
    );

    let open = Idempotency::builder(DownStore)
        .fail_open(true)
        .build()
        .expect("config");
    let result = open
        .run(&id("down"), None, handler)
        .await
        .expect("runs unguarded");
    assert_eq!(result, Outcome::Unguarded { value: false });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A codec of the caller's own: a tag byte, then JSON.
#[derive(Clone, Copy)]
struct Tagged;

impl idem::Codec for Tagged {
    fn encode<T: serde::Serialize>(&self, value: &T) -> Result<Vec<u8>, idem::BoxError> {
        let mut out = vec![b'T'];
        out.extend(serde_json::to_vec(value)?);
        Ok(out)
    }
    fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, idem::BoxError> {
        match bytes.split_first() {
            Some((b'T', json)) => Ok(serde_json::from_slice(json)?),
            _ => Err("missing tag".into()),
        }
    }
}

#[tokio::test]
async fn the_response_format_is_pluggable() {
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Receipt {
        charge: String,
        cents: u64,
    }
    let store = MemoryStore::new();
    let idem = Idempotency::builder(store.clone())
        .codec(Tagged)
        .build()
        .expect("config");
    let make = || async {
        Ok::<_, Io>(Receipt {
            charge: "ch_1".into(),
            cents: 1250,
        })
    };
    idem.run(&id("codec"), None, |_| make()).await.expect("run");
    let Some(record) = store.get(&id("codec")).await.expect("get") else {
        panic!("stored")
    };
    let State::Completed { response } = record.state else {
        panic!("completed")
    };
    assert_eq!(
        &response[..],
        b"\x00T{\"charge\":\"ch_1\",\"cents\":1250}",
        "plain envelope around the codec's bytes"
    );
    let replay = idem
        .run(&id("codec"), None, |_| make())
        .await
        .expect("replay");
    assert_eq!(
        replay,
        Outcome::Replayed {
            value: Receipt {
                charge: "ch_1".into(),
                cents: 1250
            }
        }
    );
}

#[test]
fn metrics_count_claims_replays_and_mismatches() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async {
                let idem = Idempotency::builder(MemoryStore::new())
                    .build()
                    .expect("config");
                let fp = |b: &[u8]| Some(Fingerprint::of_bytes(b));
                for _ in 0..3 {
                    idem.run(&id("m"), fp(b"a"), |_| async { Ok::<_, Io>(1u8) })
                        .await
                        .expect("run");
                }
                let mismatch = idem
                    .run(&id("m"), fp(b"b"), |_| async { Ok::<_, Io>(1u8) })
                    .await;
                assert!(matches!(mismatch, Err(RunError::Mismatch)));
            });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str, label: Option<(&str, &str)>| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| {
                key.key().name() == name
                    && label.is_none_or(|(k, v)| {
                        key.key().labels().any(|l| l.key() == k && l.value() == v)
                    })
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    };
    assert_eq!(
        counter(idem::metrics::CLAIMS, Some(("outcome", "acquired"))),
        1
    );
    // The two replays are answered from the executor's memory: no claim
    // reaches the store for them.
    assert_eq!(
        counter(idem::metrics::CLAIMS, Some(("outcome", "completed"))),
        0
    );
    assert_eq!(counter(idem::cache::CACHE_HITS, None), 2);
    assert_eq!(counter(idem::metrics::REPLAYS, None), 2);
    assert_eq!(counter(idem::metrics::MISMATCHES, None), 1);
    assert_eq!(
        counter(idem::metrics::EXECUTIONS, Some(("result", "ok"))),
        1
    );
}

/// Faults injected around the real memory store.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// `extend` never answers (a store that hangs instead of erroring).
    HangingExtend,
    /// `complete` is applied, then reported as unavailable (the answer was lost).
    CompleteAnswerLost,
    /// `claim` reports a corrupt record.
    CorruptClaim,
    /// `complete` is refused (as DynamoDB refuses an item over 400 KB),
    /// and so is a `fail` whose message passes 300 bytes.
    RefusesLargeWrites,
    /// The first `complete` finds the store unreachable, and while it is
    /// the record is deleted (an operator, or its retention ran out): the
    /// next try is refused as the lease lost.
    GoneDuringComplete,
}

/// What [`Fault::RefusesLargeWrites`] says, long enough that a failure
/// quoting it passes the limit.
fn too_large() -> StoreError {
    StoreError::Backend(
        format!(
            "ValidationException: item size too large ({})",
            "x".repeat(400)
        )
        .into(),
    )
}

#[derive(Clone)]
struct Faulty {
    fault: Fault,
    completes: Arc<AtomicU32>,
}

type Mem = MemoryStore<TokioClock>;

impl Faulty {
    /// The paused memory store with `fault` in front of it.
    fn new(fault: Fault) -> Double<Mem, Faulty> {
        Double::new(
            paused_store(),
            Faulty {
                fault,
                completes: Arc::default(),
            },
        )
    }
}

impl Hooks<Mem> for Faulty {
    async fn claim(
        &self,
        inner: &Mem,
        id: &RecordId,
        p: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        if self.fault == Fault::CorruptClaim {
            return Err(StoreError::Corrupt {
                id: id.to_string(),
                reason: "bad bytes".into(),
            });
        }
        inner.claim(id, p).await
    }
    async fn complete(
        &self,
        inner: &Mem,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if self.fault == Fault::RefusesLargeWrites {
            return Err(too_large());
        }
        if self.fault == Fault::GoneDuringComplete
            && self.completes.fetch_add(1, Ordering::SeqCst) == 0
        {
            inner.delete(&lease.id).await?;
            return Err(StoreError::Unavailable("connection refused".into()));
        }
        let result = inner.complete(lease, response, retention).await;
        if self.fault == Fault::CompleteAnswerLost
            && self.completes.fetch_add(1, Ordering::SeqCst) == 0
        {
            result?;
            return Err(StoreError::Unavailable("connection refused".into()));
        }
        result
    }
    async fn fail(
        &self,
        inner: &Mem,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if self.fault == Fault::RefusesLargeWrites && failure.message.len() > 300 {
            return Err(too_large());
        }
        inner.fail(lease, failure, retention).await
    }
    async fn extend(
        &self,
        inner: &Mem,
        lease: &Lease,
        d: Duration,
    ) -> Result<Timestamp, StoreError> {
        if self.fault == Fault::HangingExtend {
            std::future::pending::<()>().await;
        }
        inner.extend(lease, d).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_hangs_still_gets_the_lease_flagged_lost_in_time() {
    let lease = Duration::from_secs(3);
    let idem = Idempotency::builder(Faulty::new(Fault::HangingExtend))
        .lease(lease)
        .build()
        .expect("config");
    let started = tokio::time::Instant::now();
    let key = id("hang");
    let run = idem.run(&key, None, |ctx| async move {
        ctx.lease_lost().await;
        Ok::<_, Io>(started.elapsed())
    });
    let flagged_after = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the lease-lost signal must come at all")
        .expect("run")
        .into_value();
    assert!(
        flagged_after <= lease,
        "the handler must hear of the loss by the time the lease runs out, heard after {flagged_after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_answer_to_a_complete_that_landed_is_still_executed() {
    let store = Faulty::new(Fault::CompleteAnswerLost);
    let idem = Idempotency::builder(store.clone()).build().expect("config");
    let outcome = idem
        .run(&id("landed"), None, |_| async { Ok::<_, Io>(9u8) })
        .await;
    assert_eq!(
        outcome.expect("the stored outcome is ours"),
        Outcome::Executed {
            value: 9,
            attempt: 1,
            takeover: false
        }
    );
    let replay = idem
        .run(&id("landed"), None, |_| async { Ok::<_, Io>(0u8) })
        .await
        .expect("replay");
    assert_eq!(replay, Outcome::Replayed { value: 9 });
}

/// Whether a `complete` whose answer was lost had landed is read, not
/// claimed: a key deleted meanwhile is not brought back as a record bound
/// to this request's fingerprint, which would refuse a new request with
/// another body as a mismatch for a whole retention (issue 26, item 5).
#[tokio::test(start_paused = true)]
async fn checking_a_lost_complete_does_not_bring_a_deleted_key_back() {
    let store = Faulty::new(Fault::GoneDuringComplete);
    let idem = Idempotency::builder(store.clone()).build().expect("config");
    let key = id("gone");
    let first = Fingerprint::of_bytes(b"first body");
    let ran = idem
        .run(&key, Some(first), |_| async { Ok::<_, Io>(1u8) })
        .await;
    assert!(matches!(ran, Err(RunError::LeaseLost)), "{ran:?}");
    assert_eq!(
        store.inner.get(&key).await.expect("get"),
        None,
        "checking made no record"
    );
    let other = Fingerprint::of_bytes(b"another body");
    let next = idem
        .run(&key, Some(other), |_| async { Ok::<_, Io>(2u8) })
        .await
        .expect("a new request with the key runs");
    assert_eq!(
        next,
        Outcome::Executed {
            value: 2,
            attempt: 1,
            takeover: false
        }
    );
}

/// A response the store refuses (it answered, and said no) is not left as
/// a live claim to be taken over and run again: the record ends failed
/// with the reason (cut short, as the store refuses the whole of it too),
/// and later runs replay that failure (docs/design.md §5.5).
#[tokio::test(start_paused = true)]
async fn a_response_the_store_refuses_ends_the_record_failed_and_never_runs_again() {
    let lease = Duration::from_secs(3);
    let idem = Idempotency::builder(Faulty::new(Fault::RefusesLargeWrites))
        .lease(lease)
        .build()
        .expect("config");
    let runs = AtomicU32::new(0);
    let key = id("refused");
    let run = || {
        idem.run(&key, None, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Io>("receipt".to_owned()) }
        })
    };
    let first = run().await;
    assert!(
        matches!(first, Err(RunError::Store(StoreError::Backend(_)))),
        "{first:?}"
    );
    tokio::time::advance(lease * 2).await;
    let later = run().await;
    match later {
        Err(RunError::Failed(failure)) => {
            assert_eq!(failure.class, FailureClass::Terminal);
            assert!(
                failure.message.contains("refused its response"),
                "{}",
                failure.message
            );
            assert!(
                failure.message.ends_with("[cut short]"),
                "{}",
                failure.message
            );
        }
        other => panic!("the refusal is replayed, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test]
async fn fail_open_never_covers_a_store_that_answered_with_an_error() {
    let runs = AtomicU32::new(0);
    let idem = Idempotency::builder(Faulty::new(Fault::CorruptClaim))
        .fail_open(true)
        .build()
        .expect("config");
    let result = idem
        .run(&id("corrupt"), None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Io>(1u8)
        })
        .await;
    assert!(
        matches!(result, Err(RunError::Store(StoreError::Corrupt { .. }))),
        "{result:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "only an unreachable store may fail open"
    );
}

#[tokio::test(start_paused = true)]
async fn a_message_that_keeps_killing_its_worker_becomes_terminal() {
    let store = paused_store();
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(3))
        .max_attempts(NonZeroU32::new(2).expect("non-zero"))
        .build()
        .expect("config");
    for _ in 0..2 {
        let crashed = tokio::time::timeout(
            Duration::from_secs(1),
            idem.run(&id("killer"), None, |_| {
                std::future::pending::<Result<u8, Io>>()
            }),
        )
        .await;
        assert!(crashed.is_err());
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let runs = AtomicU32::new(0);
    let third = idem
        .run(&id("killer"), None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Io>(1u8)
        })
        .await;
    match third {
        Err(RunError::Failed(f)) => assert_eq!(
            f.message,
            "attempts exhausted (3 of 2): earlier attempts never finished"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn forever_durations_are_accepted_without_panics() {
    let idem = Idempotency::builder(MemoryStore::new())
        .lease(Duration::MAX)
        .retention(Duration::MAX)
        .wait_for_in_flight(Duration::MAX)
        .max_response_bytes(usize::MAX)
        .compress_above(0)
        .build()
        .expect("config");
    let value = "y".repeat(5000);
    let first = idem
        .run(&id("forever"), None, |_| async {
            Ok::<_, Io>(value.clone())
        })
        .await
        .expect("run");
    assert!(!first.is_replayed());
    let again = idem
        .run(&id("forever"), None, |_| async {
            Ok::<_, Io>(String::new())
        })
        .await
        .expect("replay");
    assert_eq!(again, Outcome::Replayed { value });
}

/// Claims made ahead in one round trip answer each run as `run` would:
/// a new key runs, a completed one replays, one held elsewhere is in
/// progress, one reused with another payload is a mismatch; a claim that
/// waited past its lease runs if nobody took it over, and does not run if
/// somebody did.
#[tokio::test(start_paused = true)]
async fn claims_made_ahead_answer_each_run_as_run_would() {
    let idem = Idempotency::builder(paused_store())
        .lease(Duration::from_secs(10))
        .heartbeat(Duration::from_secs(2))
        .build()
        .expect("config");
    let runs = Arc::new(AtomicU32::new(0));
    let handler = |value: u32| {
        let runs = Arc::clone(&runs);
        move |_ctx| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Io>(value)
        }
    };
    let done = idem
        .run(&id("done"), Some(Fingerprint::of_bytes(b"a")), handler(1))
        .await;
    assert!(matches!(done, Ok(Outcome::Executed { value: 1, .. })));
    let held = idem
        .store()
        .claim(&id("held"), &idem_params(&idem))
        .await
        .expect("claim");
    assert!(matches!(held, ClaimOutcome::Acquired(_)));

    let fp = |b: &[u8]| Some(Fingerprint::of_bytes(b));
    let mut ahead = idem
        .claim_ahead(vec![
            (id("new"), fp(b"n")),
            (id("done"), fp(b"a")),
            (id("held"), None),
            (id("done"), fp(b"other")),
            (id("late"), None),
            (id("taken"), None),
        ])
        .await
        .into_iter();
    let mut next = || ahead.next().expect("one per run");
    assert!(matches!(
        idem.run_claimed(next(), handler(2)).await,
        Ok(Outcome::Executed { value: 2, .. })
    ));
    assert!(matches!(
        idem.run_claimed(next(), handler(3)).await,
        Ok(Outcome::Replayed { value: 1 })
    ));
    assert!(matches!(
        idem.run_claimed(next(), handler(4)).await,
        Err(RunError::InProgress { .. })
    ));
    assert!(matches!(
        idem.run_claimed(next(), handler(5)).await,
        Err(RunError::Mismatch)
    ));
    let (late, taken) = (next(), next());
    tokio::time::advance(Duration::from_secs(11)).await;
    let other = idem
        .store()
        .claim(&id("taken"), &idem_params(&idem))
        .await
        .expect("claim");
    assert!(
        matches!(other, ClaimOutcome::Acquired(_)),
        "another worker takes over the expired claim"
    );
    assert!(
        matches!(
            idem.run_claimed(taken, handler(6)).await,
            Err(RunError::LeaseLost)
        ),
        "a claim taken over while it waited does not run"
    );
    assert!(
        matches!(
            idem.run_claimed(late, handler(7)).await,
            Ok(Outcome::Executed { value: 7, .. })
        ),
        "a claim nobody took over is renewed and runs"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "`done`, `new` and `late` ran"
    );
}

fn idem_params<S: Store>(idem: &Idempotency<S>) -> ClaimParams {
    ClaimParams {
        fingerprint: None,
        lease: idem.lease(),
        retention: idem.retention(),
    }
}
