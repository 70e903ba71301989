//! Parked runs settled by the consumer's reconciler, on the in-memory
//! store: a step left in doubt by an attempt that failed inside it parks
//! the run; the reconciler's finding decides whether the step runs again
//! (not applied), is skipped with the result it gives (applied), or the
//! key stays parked and the delivery is dead-lettered saying why
//! (unknown, timeout); a sweep settles parked keys with no delivery in
//! hand; deliveries reconciling at once settle the step once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::step::{Park, StepError};
use idem::{DeleteRecord, Idempotency, MemoryStore, Scope, Store};
use idem_consumer::reconcile::{Doubt, Finding, Sweep};
use idem_consumer::{Acked, Consumer, Disposition, OwnedMessage, RetryCause};

type Io = std::io::Error;

/// How many times each key's "ship" step ran (its first run fails).
#[derive(Clone, Default)]
struct Shipments(Arc<Mutex<HashMap<String, u32>>>);

impl Shipments {
    fn ran(&self, key: &str) -> u32 {
        self.0.lock().expect("lock").get(key).copied().unwrap_or(0)
    }

    /// Delivers `key` once: the handler ships in a step with the `Park`
    /// policy, whose first run fails (leaving the step started).
    async fn deliver(&self, consumer: &Consumer<MemoryStore>, key: &str) -> Disposition {
        let message = Arc::new(
            OwnedMessage::new(format!("{{\"order\":\"{key}\"}}"))
                .with_header("Idempotency-Key", key),
        );
        let shipments = self.clone();
        let key = key.to_owned();
        consumer
            .process(message, move |job| async move {
                let shipment: String = job
                    .ctx()
                    .step("ship", Park, |_| async move {
                        let mut ran = shipments.0.lock().expect("lock");
                        let n = ran.entry(key).or_default();
                        *n += 1;
                        if *n == 1 {
                            Err(Io::other("the carrier's answer was lost"))
                        } else {
                            Ok(format!("shp_{n}"))
                        }
                    })
                    .await?;
                Ok::<_, StepError<Io>>(shipment)
            })
            .await
            .disposition
    }
}

/// A consumer whose reconciler answers by key: `applied-…` applied with
/// `"shp_found"`, `not-…` not applied, `slow-…` too late, `unknown-…`
/// unknown until `now_known` is set (then not applied), `deleted-…` not
/// applied after deleting the record (as if it expired meanwhile). Every
/// question is kept. The limits are given before the reconciler.
fn consumer(now_known: Arc<AtomicBool>, asked: Arc<Mutex<Vec<Doubt>>>) -> Consumer<MemoryStore> {
    let store = MemoryStore::new();
    let records = store.clone();
    let idem = Idempotency::builder(store).build().expect("config");
    Consumer::builder(idem, Scope::new("shipping").expect("scope"))
        .reconcile_limits(Duration::from_millis(300), 4)
        .reconciler(move |doubt: Doubt| {
            let (now_known, asked) = (Arc::clone(&now_known), Arc::clone(&asked));
            let records = records.clone();
            async move {
                let key = doubt.id.key().as_str().to_owned();
                if key.starts_with("deleted") {
                    records.delete(&doubt.id).await.expect("delete");
                }
                asked.lock().expect("lock").push(doubt);
                if key.starts_with("applied") {
                    Finding::Applied(serde_json::json!("shp_found"))
                } else if key.starts_with("slow") {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Finding::NotApplied
                } else if key.starts_with("unknown") && !now_known.load(Ordering::SeqCst) {
                    Finding::Unknown("the carrier's API is down".into())
                } else {
                    Finding::NotApplied
                }
            }
        })
        .build()
}

fn retried(disposition: &Disposition) -> bool {
    matches!(
        disposition,
        Disposition::Retry {
            cause: RetryCause::Failed { .. },
            ..
        }
    )
}

#[tokio::test]
async fn findings_decide_whether_the_step_runs_again() {
    let (known, asked) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let consumer = consumer(known, Arc::clone(&asked));
    let shipments = Shipments::default();
    for key in ["applied-1", "not-1"] {
        assert!(
            retried(&shipments.deliver(&consumer, key).await),
            "{key}: the failed step is retried"
        );
        assert_eq!(
            shipments.deliver(&consumer, key).await,
            Disposition::Retry {
                after: Duration::from_millis(100),
                cause: RetryCause::Reconciled
            },
            "{key}: parked, settled, delivered again"
        );
        assert_eq!(
            shipments.deliver(&consumer, key).await,
            Disposition::Ack(Acked::Executed),
            "{key}: the run resumes and completes"
        );
    }
    assert_eq!(
        shipments.ran("applied-1"),
        1,
        "an applied step is not run again"
    );
    assert_eq!(shipments.ran("not-1"), 2, "a step not applied runs again");
    let result = consumer
        .idempotency()
        .store()
        .peek(&idem::RecordId::parse("shipping", "applied-1").expect("id"))
        .await
        .expect("peek")
        .expect("record");
    match result.state {
        // The layout byte (0: plain), then the handler's result as JSON.
        idem::State::Completed { response } => assert_eq!(&response[..], b"\0\"shp_found\""),
        other => panic!("completed with the found shipment, got {other:?}"),
    }
    let asked = asked.lock().expect("lock");
    assert_eq!(asked.len(), 2);
    // Attempt 1 ran it and lost the answer; attempt 2 found it in doubt,
    // marked it and parked.
    assert_eq!((asked[0].step.as_str(), asked[0].attempt), ("ship", 2));
    assert_eq!(
        asked[0].downstream_key,
        idem::step::downstream_key(&asked[0].id, "ship"),
        "the key the step's work was given"
    );
    assert_eq!(
        asked[0].payload.as_deref(),
        Some(&b"{\"order\":\"applied-1\"}"[..]),
        "asked with the delivery's payload"
    );
}

#[tokio::test]
async fn unknown_or_late_findings_leave_the_key_parked_until_a_sweep_settles_it() {
    let (known, asked) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let consumer = consumer(Arc::clone(&known), Arc::clone(&asked));
    let shipments = Shipments::default();
    for (key, why) in [
        ("unknown-1", "the carrier's API is down"),
        ("slow-1", "no finding within the timeout"),
    ] {
        assert!(retried(&shipments.deliver(&consumer, key).await));
        match shipments.deliver(&consumer, key).await {
            Disposition::DeadLetter { reason } => {
                assert!(reason.contains("\"ship\" is in doubt"), "{reason}");
                assert!(reason.contains(why), "{key}: {reason}");
            }
            other => panic!("{key}: dead-lettered, got {other:?}"),
        }
        match shipments.deliver(&consumer, key).await {
            Disposition::DeadLetter { .. } => {}
            other => panic!("{key}: still parked, got {other:?}"),
        }
    }
    known.store(true, Ordering::SeqCst);
    assert_eq!(
        consumer.sweep_parked(10).await.expect("sweep"),
        Sweep {
            parked: 2,
            settled: 1
        },
        "the unknown one is settled now; the slow one is still too slow"
    );
    // On a schedule: the sweep asks about the slow one again each pass.
    let asked_before = asked.lock().expect("lock").len();
    let sweeping = consumer.spawn_parked_sweep(Duration::from_millis(100), 10);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(sweeping);
    let passes = asked.lock().expect("lock").len() - asked_before;
    assert!(passes >= 2, "asked again on each pass: {passes}");
    assert_eq!(
        shipments.deliver(&consumer, "unknown-1").await,
        Disposition::Ack(Acked::Executed)
    );
    assert_eq!(shipments.ran("unknown-1"), 2);
    assert_eq!(shipments.ran("slow-1"), 1, "never run while in doubt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_reconciling_at_once_settle_the_step_once() {
    let (known, asked) = (Arc::new(AtomicBool::new(true)), Arc::default());
    let consumer = consumer(known, asked);
    let shipments = Shipments::default();
    let keys: Vec<String> = (0..16).map(|i| format!("not-{i}")).collect();
    for key in &keys {
        assert!(retried(&shipments.deliver(&consumer, key).await));
    }
    let deliveries: Vec<_> = keys
        .iter()
        .flat_map(|key| [key.clone(), key.clone()])
        .map(|key| {
            let (consumer, shipments) = (consumer.clone(), shipments.clone());
            tokio::spawn(async move { shipments.deliver(&consumer, &key).await })
        })
        .collect();
    for delivery in deliveries {
        let disposition = delivery.await.expect("delivery");
        assert!(
            !matches!(disposition, Disposition::DeadLetter { .. }),
            "settled by one or the other, never dead-lettered: {disposition:?}"
        );
    }
    for key in &keys {
        assert!(matches!(
            shipments.deliver(&consumer, key).await,
            Disposition::Ack(_)
        ));
        assert_eq!(
            shipments.ran(key),
            2,
            "{key}: once in doubt, once after it was settled"
        );
    }
}

/// A key whose record is gone by the time the finding is written (expired
/// or deleted meanwhile) is not "settled": its retry would run every step
/// again with the journal gone. It is dead-lettered for a person.
#[tokio::test]
async fn a_record_gone_before_it_is_settled_is_left_for_a_person() {
    let (known, asked) = (Arc::new(AtomicBool::new(true)), Arc::default());
    let consumer = consumer(known, asked);
    let shipments = Shipments::default();
    assert!(retried(&shipments.deliver(&consumer, "deleted-1").await));
    match shipments.deliver(&consumer, "deleted-1").await {
        Disposition::DeadLetter { reason } => {
            assert!(reason.contains("expired (or was deleted)"), "{reason}")
        }
        other => panic!("dead-lettered, got {other:?}"),
    }
    assert_eq!(shipments.ran("deleted-1"), 1);
}
