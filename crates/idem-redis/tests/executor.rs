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

/// The waiter is woken by the record's own publish, not by polling: on
/// servers of its own, a waiter that waits 1.5 s for a run reads the
/// record a handful of times (a poll with a 5 ms to 200 ms backoff reads
/// it about a dozen times), and gets the outcome within moments of its
/// landing.
async fn woken_by_the_publish(url: &str, servers: &[idem_testkit::servers::redis::RedisServer]) {
    let store = RedisStore::connect(url).await.expect("connect");
    // Loaded first, so that the counts below are scripts that ran, not
    // `EVALSHA`s refused with `NOSCRIPT` and sent again as `EVAL`.
    store.load_scripts().await.expect("load scripts");
    let idem = Idempotency::builder(store)
        .wait_for_in_flight(Duration::from_secs(10))
        .build()
        .expect("executor");
    let id = RecordId::parse("orders", "published").expect("valid");
    let (started, start) = tokio::sync::oneshot::channel();
    let landed = Arc::new(parking_lot::Mutex::new(None));
    let slow = {
        let (idem, id, landed) = (idem.clone(), id.clone(), Arc::clone(&landed));
        tokio::spawn(async move {
            let outcome = idem
                .run(&id, None, |_| async move {
                    let _ = started.send(());
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Ok::<_, std::io::Error>("done".to_owned())
                })
                .await;
            *landed.lock() = Some(std::time::Instant::now());
            outcome
        })
    };
    start.await.expect("handler started");
    for server in servers {
        server.cli("CONFIG RESETSTAT").expect("reset stats");
    }
    let outcome = idem
        .run(&id, None, |_| async {
            Ok::<_, std::io::Error>("twice".to_owned())
        })
        .await
        .expect("outcome");
    let woke = std::time::Instant::now();
    assert!(matches!(outcome, Outcome::Replayed { ref value } if value == "done"));
    slow.await.expect("task").expect("executed");
    let landed = landed.lock().expect("landed");
    assert!(
        woke.saturating_duration_since(landed) < Duration::from_millis(150),
        "woken {:?} after the outcome landed",
        woke.saturating_duration_since(landed)
    );
    let stats: Vec<String> = servers
        .iter()
        .map(|s| s.cli("INFO commandstats").expect("stats"))
        .collect();
    let calls = |command: &str| -> u64 {
        stats
            .iter()
            .map(|s| idem_testkit::servers::redis::CommandStats::of(s, command).calls)
            .sum()
    };
    // The waiter's first claim, its watch (and at most one more from the
    // safety net), its claim once woken, and the run's completion.
    let scripts = calls("evalsha") + calls("eval");
    assert!(
        scripts <= 5,
        "{scripts} scripts ran while the waiter waited: {stats:?}"
    );
    assert_eq!(calls("subscribe"), 1, "{stats:?}");
    assert_eq!(calls("publish"), 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_is_woken_by_the_publish_not_by_polling() {
    let server = idem_testkit::servers::redis::RedisServer::start().expect("redis-server");
    woken_by_the_publish(&server.url(), std::slice::from_ref(&server)).await;
}

/// An end that nobody waits for publishes nothing (a `PUBLISH` from a
/// script costs Redis about 1 µs even with no subscriber).
#[tokio::test]
async fn a_run_nobody_waits_for_publishes_nothing() {
    let server = idem_testkit::servers::redis::RedisServer::start().expect("redis-server");
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    let idem = Idempotency::builder(store).build().expect("executor");
    for key in ["a", "b"] {
        let id = RecordId::parse("orders", key).expect("valid");
        idem.run(&id, None, |_| async { Ok::<_, std::io::Error>(1u8) })
            .await
            .expect("run");
    }
    let stats = server.cli("INFO commandstats").expect("stats");
    assert!(
        stats.contains("cmdstat_evalsha") || stats.contains("cmdstat_eval:"),
        "{stats}"
    );
    assert!(!stats.contains("cmdstat_publish"), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_too() {
    let cluster = idem_testkit::servers::redis::RedisCluster::start().expect("a Redis Cluster");
    woken_by_the_publish(&cluster.url(), cluster.nodes()).await;
}
