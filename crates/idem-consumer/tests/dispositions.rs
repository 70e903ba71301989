//! The §9 mapping from executor outcome to disposition, over the real
//! in-memory store: each row of the table, the counters, and the
//! heartbeat-driven keep-alive. The adapters prove the same against real
//! brokers and networked stores.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Backoff, Idempotency, MemoryStore, Scope, Store, Terminal};
use idem_consumer::{
    Acked, Consumer, Disposition, KeyExtractor, Message, MissingKey, OwnedMessage,
    RedeliveryWindow, RetryCause, WindowError,
};
use idem_testkit::doubles::{Double, Hooks};
use idem_testkit::DownStore;
use idem_testkit::TokioClock;

type Io = std::io::Error;

fn consumer<S: Store>(store: S) -> Consumer<S> {
    let idem = Idempotency::builder(store)
        .max_attempts(NonZeroU32::new(3).expect("non-zero"))
        .backoff(Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(1),
        ))
        .build()
        .expect("config");
    Consumer::builder(idem, Scope::new("orders").expect("scope")).build()
}

fn keyed(key: &str, payload: &str) -> Arc<OwnedMessage> {
    Arc::new(OwnedMessage::new(payload.to_owned()).with_header("Idempotency-Key", key))
}

fn dead_letter_reason(d: &Disposition) -> &str {
    match d {
        Disposition::DeadLetter { reason } => reason,
        other => panic!("expected a dead-letter, got {other:?}"),
    }
}

#[tokio::test]
async fn a_duplicate_is_acked_with_the_stored_outcome_and_runs_nothing() {
    let consumer = consumer(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let message = keyed("o-1", r#"{"amount": 5}"#);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let decision = consumer
            .process(Arc::clone(&message), |job| {
                runs.fetch_add(1, Ordering::SeqCst);
                let key = job.key().to_string();
                async move { Ok::<_, Io>(key) }
            })
            .await;
        assert_eq!(decision.key.as_ref().map(|k| k.as_str()), Some("o-1"));
        seen.push(decision.disposition);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        seen,
        [
            Disposition::Ack(Acked::Executed),
            Disposition::Ack(Acked::Replayed),
            Disposition::Ack(Acked::Replayed)
        ]
    );
    let stats = consumer.stats();
    assert_eq!((stats.executed, stats.replayed), (1, 2));
    assert!((stats.duplicate_rate() - 2.0 / 3.0).abs() < 1e-9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_in_flight_elsewhere_is_retried_never_acked_and_never_run() {
    let consumer = consumer(MemoryStore::new());
    let runs = Arc::new(AtomicU32::new(0));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (consumer, runs) = (consumer.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            consumer
                .process(keyed("o-2", "{}"), |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    started_tx.send(()).expect("test waits");
                    finish_rx.await.expect("test finishes it");
                    Ok::<_, Io>(())
                })
                .await
        })
    };
    started_rx.await.expect("first run started");
    let mut dups = Vec::new();
    for _ in 0..8 {
        let (consumer, runs) = (consumer.clone(), Arc::clone(&runs));
        dups.push(tokio::spawn(async move {
            consumer
                .process(keyed("o-2", "{}"), |_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Io>(())
                })
                .await
        }));
    }
    for dup in dups {
        let decision = dup.await.expect("task");
        match decision.disposition {
            Disposition::Retry {
                after,
                cause: RetryCause::InProgress,
            } => assert!(after >= Duration::from_millis(100), "{after:?}"),
            other => panic!("a duplicate in flight must be retried, got {other:?}"),
        }
    }
    finish_tx.send(()).expect("first still running");
    assert_eq!(
        first.await.expect("task").disposition,
        Disposition::Ack(Acked::Executed)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(consumer.stats().in_flight_conflicts, 8);
}

#[tokio::test]
async fn a_retryable_failure_is_retried_with_backoff_then_succeeds() {
    let consumer = consumer(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let message = keyed("o-3", "{}");
    let handler = |_job| {
        let n = runs.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(Io::other("downstream timed out"))
            } else {
                Ok(())
            }
        }
    };
    let first = consumer.process(Arc::clone(&message), handler).await;
    match first.disposition {
        Disposition::Retry {
            after,
            cause: RetryCause::Failed { attempt: 1, error },
        } => {
            assert_eq!(error, "downstream timed out");
            assert!(after >= Duration::from_millis(100) && after <= Duration::from_millis(200));
        }
        other => panic!("{other:?}"),
    }
    let second = consumer.process(message, handler).await;
    assert_eq!(second.disposition, Disposition::Ack(Acked::Executed));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn exhausted_attempts_and_terminal_failures_are_dead_lettered_with_the_reason() {
    let consumer = consumer(MemoryStore::new());
    let message = keyed("o-4", "{}");
    let runs = AtomicU32::new(0);
    let mut last = None;
    for _ in 0..3 {
        last = Some(
            consumer
                .process(Arc::clone(&message), |_| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async { Err::<(), _>(Io::other("still down")) }
                })
                .await
                .disposition,
        );
    }
    let reason = dead_letter_reason(last.as_ref().expect("ran"));
    assert!(
        reason.contains("attempt 3") && reason.contains("still down"),
        "{reason}"
    );
    let again = consumer
        .process(message, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Io>(()) }
        })
        .await;
    assert!(
        dead_letter_reason(&again.disposition).starts_with("stored terminal failure, replayed"),
        "a redelivered poison message goes to the dead-letter destination again: {again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let poison = consumer
        .process(keyed("o-5", "{not json"), |job| async move {
            let _order: serde_json::Value = job.json()?;
            Ok::<_, Terminal>(())
        })
        .await;
    let reason = dead_letter_reason(&poison.disposition);
    assert!(
        reason.starts_with("handler failed terminally on attempt 1: payload is not a valid"),
        "{reason}"
    );
    assert_eq!(consumer.stats().dead_letters, 3);
}

#[tokio::test]
async fn bad_keys_and_reused_keys_are_dead_lettered_without_running() {
    let consumer = consumer(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let handler = |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Io>(()) }
    };
    let keyless = consumer
        .process(Arc::new(OwnedMessage::new("{}")), handler)
        .await;
    assert_eq!(keyless.key, None);
    assert_eq!(
        dead_letter_reason(&keyless.disposition),
        "no idempotency key: header \"Idempotency-Key\", message id absent"
    );
    let bad = consumer.process(keyed("has space", "{}"), handler).await;
    assert!(dead_letter_reason(&bad.disposition).contains("byte 0x20"));

    consumer
        .process(keyed("o-6", r#"{"amount": 1}"#), handler)
        .await;
    let same_content = consumer
        .process(keyed("o-6", r#"{ "amount":1 }"#), handler)
        .await;
    assert_eq!(
        same_content.disposition,
        Disposition::Ack(Acked::Replayed),
        "same canonical JSON is the same payload"
    );
    let reused = consumer
        .process(keyed("o-6", r#"{"amount": 2}"#), handler)
        .await;
    assert_eq!(
        dead_letter_reason(&reused.disposition),
        "idempotency key was already used with a different payload"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_configured_content_hash_keys_keyless_deliveries() {
    let idem = Idempotency::builder(MemoryStore::new())
        .build()
        .expect("config");
    let consumer = Consumer::builder(idem, Scope::new("events").expect("scope"))
        .keys(KeyExtractor::header("Idempotency-Key").on_missing(MissingKey::ContentHash))
        .build();
    let runs = AtomicU32::new(0);
    for payload in [r#"{"a":1,"b":2}"#, r#"{"b":2, "a":1}"#] {
        consumer
            .process(Arc::new(OwnedMessage::new(payload.to_owned())), |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Io>(()) }
            })
            .await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_uuid_v7_key_older_than_the_retention_is_dead_lettered_when_asked() {
    let idem = Idempotency::builder(MemoryStore::new())
        .build()
        .expect("config");
    let retention = idem.retention();
    let consumer = Consumer::builder(idem, Scope::new("late").expect("scope"))
        .keys(KeyExtractor::header("Idempotency-Key").reject_old_uuid_v7(retention))
        .build();
    let runs = AtomicU32::new(0);
    // Minted 2020-01-01: far older than the 24 h retention.
    let old = keyed("016f5e66-e800-7000-8000-000000000000", "{}");
    let decision = consumer
        .process(old, |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Io>(()) }
        })
        .await;
    let reason = dead_letter_reason(&decision.disposition);
    assert!(reason.contains("UUIDv7 minted"), "{reason}");
    assert!(reason.contains("longer than records are kept"), "{reason}");
    // A key that is not a UUIDv7 runs as usual.
    let decision = consumer
        .process(keyed("order-9", "{}"), |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Io>(()) }
        })
        .await;
    assert_eq!(decision.disposition, Disposition::Ack(Acked::Executed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_delivery_after_its_record_expired_is_dead_lettered_when_the_store_remembers() {
    let day = Duration::from_secs(86_400);
    let clock = idem::ManualClock::default();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .remember_expired(day * 30)
        .build();
    let idem = Idempotency::builder(store)
        .retention(day)
        .build()
        .expect("config");
    let consumer = Consumer::builder(idem, Scope::new("late").expect("scope")).build();
    let runs = AtomicU32::new(0);
    let message = keyed("order-12", r#"{"amount": 5}"#);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let decision = consumer
            .process(Arc::clone(&message), |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Io>(()) }
            })
            .await;
        seen.push(decision.disposition);
        clock.advance(day * 2);
    }
    assert_eq!(seen[0], Disposition::Ack(Acked::Executed));
    let reason = dead_letter_reason(&seen[1]);
    assert!(
        reason.contains("after its idempotency record expired"),
        "{reason}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run a second time");
}

#[tokio::test]
async fn a_store_outage_is_retried_fail_closed() {
    let consumer = consumer(DownStore);
    let runs = AtomicU32::new(0);
    let decision = consumer
        .process(keyed("o-7", "{}"), |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Io>(()) }
        })
        .await;
    match decision.disposition {
        Disposition::Retry {
            cause: cause @ RetryCause::Store(_),
            ..
        } => {
            let text = cause.to_string();
            assert!(text.contains("connection refused"), "{text}");
            assert!(text.contains("nothing ran"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "fail-closed: nothing ran");
}

/// A store that takes claims but is gone by the time an outcome is to be
/// kept: a stand-in for an outage that starts while the handler runs.
#[derive(Debug, Clone, Default)]
struct GoneAfterClaim;

fn gone() -> idem::StoreError {
    idem::StoreError::Unavailable("connection reset".into())
}

impl Hooks<MemoryStore> for GoneAfterClaim {
    async fn complete(
        &self,
        _: &MemoryStore,
        _: &idem::store::Lease,
        _: bytes::Bytes,
        _: Duration,
    ) -> Result<(), idem::StoreError> {
        Err(gone())
    }

    async fn fail(
        &self,
        _: &MemoryStore,
        _: &idem::store::Lease,
        _: idem::Failure,
        _: Duration,
    ) -> Result<(), idem::StoreError> {
        Err(gone())
    }

    async fn release(
        &self,
        _: &MemoryStore,
        _: &idem::store::Lease,
    ) -> Result<(), idem::StoreError> {
        Err(gone())
    }
}

#[tokio::test]
async fn an_outcome_the_store_could_not_keep_says_the_handler_ran() {
    let consumer = consumer(Double::new(MemoryStore::new(), GoneAfterClaim));
    let runs = AtomicU32::new(0);
    let decision = consumer
        .process(keyed("o-7b", "{}"), |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Io>(()) }
        })
        .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    match decision.disposition {
        Disposition::Retry {
            cause: cause @ RetryCause::Unstored(_),
            ..
        } => {
            let text = cause.to_string();
            assert!(text.contains("the handler ran"), "{text}");
            assert!(text.contains("connection reset"), "{text}");
            assert!(!text.contains("nothing ran"), "{text}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_panicking_handler_is_retried_after_its_lease_not_lost() {
    let consumer = consumer(MemoryStore::new());
    let decision = consumer
        .process(keyed("o-8", "{}"), |_| async {
            if true {
                panic!("index out of bounds");
            }
            Ok::<_, Io>(())
        })
        .await;
    match decision.disposition {
        Disposition::Retry {
            after,
            cause: RetryCause::Panicked(message),
        } => {
            assert_eq!(message, "index out of bounds");
            assert_eq!(after, Duration::from_secs(30), "the default lease");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(consumer.stats().retries, 1);
}

/// Counts keep-alives, as a broker's in-progress ack would.
struct Watched {
    inner: OwnedMessage,
    keep_alives: Arc<AtomicU32>,
}

impl Message for Watched {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.inner.header(name)
    }
    async fn keep_alive(&self) {
        self.keep_alives.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn each_confirmed_heartbeat_keeps_the_delivery_alive_with_the_broker() {
    let store = MemoryStore::builder().clock(TokioClock::new()).build();
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(6))
        .heartbeat(Duration::from_secs(2))
        .build()
        .expect("config");
    let consumer = Consumer::builder(idem, Scope::new("slow").expect("scope")).build();
    let keep_alives = Arc::new(AtomicU32::new(0));
    let message = Arc::new(Watched {
        inner: OwnedMessage::new("{}").with_header("Idempotency-Key", "long"),
        keep_alives: Arc::clone(&keep_alives),
    });
    let decision = consumer
        .process(message, |_| async {
            tokio::time::sleep(Duration::from_secs(9)).await;
            Ok::<_, Io>(())
        })
        .await;
    assert_eq!(decision.disposition, Disposition::Ack(Acked::Executed));
    assert_eq!(
        keep_alives.load(Ordering::SeqCst),
        4,
        "heartbeats at 2, 4, 6 and 8 s"
    );
}

#[test]
fn retention_shorter_than_the_redelivery_window_is_refused_at_start_up() {
    let idem = Idempotency::builder(MemoryStore::new())
        .retention(Duration::from_secs(3600))
        .failure_retention(Duration::from_secs(7200))
        .build()
        .expect("config");
    let consumer = Consumer::builder(idem.clone(), Scope::new("s").expect("scope")).build();
    assert_eq!(
        consumer.check_windows(&[RedeliveryWindow::new(
            "queue \"q\" x-message-ttl",
            Duration::from_secs(1800)
        )]),
        Ok(())
    );
    let err = consumer
        .check_windows(&[RedeliveryWindow::new(
            "stream \"ORDERS\" max_age",
            Duration::from_secs(86_400),
        )])
        .expect_err("refused");
    assert!(matches!(
        err,
        WindowError::RetentionTooShort {
            which: "retention",
            ..
        }
    ));
    assert!(
        err.to_string().contains("stream \"ORDERS\" max_age"),
        "{err}"
    );
    let err = consumer
        .check_windows(&[RedeliveryWindow::unbounded("stream \"ORDERS\" max_age")])
        .expect_err("refused");
    assert!(matches!(err, WindowError::Unbounded { .. }), "{err}");
    let err = idem_consumer::check_keep_alive(&idem, "consumer ack_wait", Duration::from_secs(5))
        .expect_err("refused");
    assert!(matches!(err, WindowError::HeartbeatTooSlow { .. }), "{err}");
}

/// A delivery keyed by an id the broker assigns at each send (SQS's
/// `MessageId`) is counted: its redelivery is caught, the producer's
/// second send of the same order is not. A producer's key, or an id the
/// producer sets, is not counted.
#[tokio::test]
async fn deliveries_keyed_by_an_id_assigned_at_each_send_are_counted() {
    let consumer = consumer(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let sent = |id: &str| {
        Arc::new(
            OwnedMessage::new(r#"{"order": 7}"#)
                .with_message_id(id)
                .with_message_id_per_send("SQS's MessageId"),
        )
    };
    let deliveries = [
        sent("m-1"),
        sent("m-1"),
        sent("m-2"),
        Arc::new(
            OwnedMessage::new(r#"{"order": 8}"#)
                .with_header("Idempotency-Key", "o-8")
                .with_message_id("m-3")
                .with_message_id_per_send("SQS's MessageId"),
        ),
        Arc::new(OwnedMessage::new(r#"{"order": 9}"#).with_message_id("producer-set-9")),
    ];
    for message in deliveries {
        consumer
            .process(message, |_| {
                runs.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Io>(()) }
            })
            .await;
    }
    let stats = consumer.stats();
    assert_eq!(stats.keyed_by_send_id, 3, "{stats:?}");
    // The redelivery of m-1 was replayed; the second send (m-2) ran again.
    assert_eq!((stats.executed, stats.replayed), (4, 1), "{stats:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

/// The broker's last delivery of a message (its delivery limit) is
/// dead-lettered with the reason and its key, never run: run and
/// returned once more, the broker would move it aside without a reason.
/// Earlier deliveries run as usual.
#[tokio::test]
async fn the_brokers_last_delivery_is_dead_lettered_with_the_reason_not_run() {
    let consumer = consumer(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let delivery = |count: u32| {
        Arc::new(
            OwnedMessage::new(r#"{"order": 7}"#)
                .with_header("Idempotency-Key", &format!("o-{count}"))
                .with_delivery_count(count)
                .with_last_delivery(3),
        )
    };
    let mut decisions = Vec::new();
    for count in [2, 3, 4] {
        decisions.push(
            consumer
                .process(delivery(count), |_| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, Io>(()) }
                })
                .await,
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only delivery 2 ran");
    assert_eq!(decisions[0].disposition, Disposition::Ack(Acked::Executed));
    for decision in &decisions[1..] {
        let reason = dead_letter_reason(&decision.disposition);
        assert!(reason.contains("last the broker makes"), "{reason}");
        assert!(decision.key.is_some(), "the dead-letter names the key");
    }
    assert_eq!(consumer.stats().dead_letters, 2);
}
