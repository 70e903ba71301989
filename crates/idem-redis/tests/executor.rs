//! The executor over a real Redis: concurrent duplicates run the handler
//! once, and a duplicate that waits for an in-flight one gets its outcome.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod common;

use idem::{Idempotency, Outcome, RecordId};
use idem_redis::RedisStore;
use tokio::sync::Barrier;

async fn store() -> RedisStore {
    common::store("exec").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_duplicates_run_the_handler_once() {
    let idem = Idempotency::builder(store().await)
        .wait_for_in_flight(Duration::from_secs(20))
        .build()
        .expect("executor");
    let ran = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(64));
    let id = RecordId::parse("orders", "order-7").expect("valid");
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (idem, ran, barrier, id) = (
                idem.clone(),
                Arc::clone(&ran),
                Arc::clone(&barrier),
                id.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                idem.run(&id, None, |_| async move {
                    let n = ran.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, std::io::Error>(format!("shipment {n}"))
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
            .expect("every duplicate gets the outcome");
        assert_eq!(outcome.value(), "shipment 0");
        executed += usize::from(matches!(outcome, Outcome::Executed { .. }));
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(executed, 1, "one Executed, 63 Replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_gets_the_outcome_when_it_lands() {
    let store = store().await;
    let first = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let waiter = Idempotency::builder(store)
        .lease(Duration::from_secs(60))
        .wait_for_in_flight(Duration::from_secs(60))
        .build()
        .expect("executor");
    let id = RecordId::parse("orders", "slow").expect("valid");
    let (started, start) = tokio::sync::oneshot::channel();
    let slow = {
        let id = id.clone();
        tokio::spawn(async move {
            first
                .run(&id, None, |_| async move {
                    let _ = started.send(());
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, std::io::Error>("done".to_owned())
                })
                .await
        })
    };
    start.await.expect("handler started");
    // Without a store-side wait the duplicate would sleep out the whole
    // 60 s lease; the bound here only catches that, it measures nothing.
    let outcome = tokio::time::timeout(
        Duration::from_secs(20),
        waiter.run(&id, None, |_| async {
            Ok::<_, std::io::Error>("twice".to_owned())
        }),
    )
    .await
    .expect("the waiter is woken by the outcome, not by its timeout")
    .expect("outcome");
    assert!(
        matches!(outcome, Outcome::Replayed { ref value } if value == "done"),
        "{outcome:?}"
    );
    assert!(matches!(
        slow.await.expect("task"),
        Ok(Outcome::Executed { .. })
    ));
}
