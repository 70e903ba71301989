//! The settle policy of `Consumer::run`, which every broker adapter
//! shares, over the in-memory at-least-once broker and the real in-memory
//! store: what is acked, retried and dead-lettered, with which headers,
//! and that nothing is lost when a dead-letter copy fails, a worker stops
//! or a handler outlives the visibility timeout.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Backoff, Idempotency, MemoryStore, Scope, Terminal};
use idem_consumer::{
    Broker, Consumer, Job, MemoryBroker, MemoryMessage, Message, OwnedMessage, Stopped,
    CONSUMER_HEADER, KEY_HEADER, REASON_HEADER,
};
use idem_testkit::TokioClock;

type Io = std::io::Error;

#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("poison")]
    Poison(#[source] Terminal),
    #[error("downstream timed out")]
    Flaky,
}

fn consumer() -> Consumer<MemoryStore<TokioClock>> {
    let store = MemoryStore::builder().clock(TokioClock::new()).build();
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(6))
        .heartbeat(Duration::from_secs(2))
        .max_attempts(NonZeroU32::new(3).expect("non-zero"))
        .backoff(Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(1),
        ))
        .build()
        .expect("config");
    Consumer::builder(idem, Scope::new("orders").expect("scope"))
        .retry_delay(Duration::from_millis(100), Duration::from_secs(2))
        .build()
}

fn order(key: &str, payload: &str) -> OwnedMessage {
    OwnedMessage::new(payload.to_owned()).with_header("Idempotency-Key", key)
}

/// Runs every key's handler from `behaviour` and counts the calls per key.
struct Handler {
    calls: Arc<Mutex<HashMap<String, u32>>>,
}

impl Handler {
    fn new() -> Self {
        Self {
            calls: Arc::default(),
        }
    }

    fn calls(&self, key: &str) -> u32 {
        self.calls
            .lock()
            .expect("lock")
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// A handler: `poison` fails terminally, `flaky` fails on its first
    /// call, `slow` takes 20 s; everything else succeeds at once.
    fn run(
        &self,
    ) -> impl Fn(Job<MemoryMessage>) -> futures_util::future::BoxFuture<'static, Result<u32, Failure>>
           + Send
           + Sync
           + 'static {
        let calls = Arc::clone(&self.calls);
        move |job| {
            let key = job.key().as_str().to_owned();
            let call = {
                let mut calls = calls.lock().expect("lock");
                let n = calls.entry(key.clone()).or_default();
                *n += 1;
                *n
            };
            Box::pin(async move {
                match key.as_str() {
                    "poison" => Err(Failure::Poison(Terminal::new(
                        "the order is for a product\nthat never existed",
                    ))),
                    "flaky" if call == 1 => Err(Failure::Flaky),
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(20)).await;
                        Ok(call)
                    }
                    _ => Ok(call),
                }
            })
        }
    }
}

#[tokio::test(start_paused = true)]
async fn duplicates_are_acked_retries_come_back_and_poison_is_dead_lettered_once() {
    let consumer = consumer();
    let broker = Arc::new(MemoryBroker::new());
    for message in [
        order("o-1", r#"{"n":1}"#),
        order("o-1", r#"{"n":1}"#),
        order("o-1", r#"{"n":1}"#),
        order("flaky", "{}"),
        order("poison", "{}"),
        OwnedMessage::new("no key at all"),
    ] {
        broker.publish(message);
    }
    broker.close();
    let handler = Handler::new();
    let stopped = consumer
        .run(&broker, handler.run(), std::future::pending())
        .await
        .expect("the memory broker does not fail");

    assert_eq!(stopped, Stopped::Ended, "every message was settled");
    assert_eq!(broker.unsettled(), 0);
    assert_eq!(handler.calls("o-1"), 1, "duplicates replay");
    assert_eq!(handler.calls("flaky"), 2, "retried once, then done");
    assert_eq!(handler.calls("poison"), 1, "terminal: never retried");
    assert_eq!(broker.acked(), 4, "three o-1 and the flaky one");
    let stats = consumer.stats();
    assert_eq!(
        (
            stats.executed,
            stats.replayed,
            stats.retries,
            stats.dead_letters
        ),
        (2, 2, 1, 2)
    );

    let dead = broker.dead_letters();
    let mut letters: Vec<_> = dead
        .iter()
        .map(|m| {
            assert_eq!(m.header(CONSUMER_HEADER), Some("orders"));
            (
                m.header(KEY_HEADER).map(str::to_owned),
                m.header(REASON_HEADER).expect("reason").to_owned(),
                m.payload().to_vec(),
            )
        })
        .collect();
    letters.sort();
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(letters[0].0, None, "no key could be read");
    assert!(letters[0].1.contains("Idempotency-Key"), "{}", letters[0].1);
    assert_eq!(letters[0].2, b"no key at all", "the payload is copied");
    assert_eq!(letters[1].0.as_deref(), Some("poison"));
    assert!(letters[1].1.contains("never existed"), "{}", letters[1].1);
    assert!(
        !letters[1].1.contains('\n'),
        "header values are one line: {}",
        letters[1].1
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_copy_that_fails_leaves_the_message_to_be_retried_not_lost() {
    let consumer = consumer();
    let broker = Arc::new(MemoryBroker::new());
    broker.fail_dead_letters(true);
    broker.publish(order("poison", "{}"));
    broker.close();
    let handler = Handler::new();
    let run = consumer.run(&broker, handler.run(), std::future::pending());
    tokio::pin!(run);
    tokio::select! {
        stopped = &mut run => panic!("ended with the copy refused: {stopped:?}"),
        () = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    assert_eq!(broker.unsettled(), 1, "the original stays with the broker");
    assert!(broker.dead_letters().is_empty());
    assert!(
        broker.deliveries_made() >= 2,
        "it came back after the longest retry delay ({} deliveries)",
        broker.deliveries_made()
    );

    broker.fail_dead_letters(false);
    assert_eq!(run.await.expect("no broker error"), Stopped::Ended);
    assert_eq!(broker.dead_letters().len(), 1);
    assert_eq!(broker.unsettled(), 0);
    assert_eq!(
        handler.calls("poison"),
        1,
        "the stored terminal failure is replayed, not run again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_handler_longer_than_the_visibility_timeout_keeps_its_delivery() {
    let consumer = consumer();
    let broker = Arc::new(MemoryBroker::new().visibility(Duration::from_secs(5)));
    broker.publish(order("slow", "{}"));
    broker.close();
    let handler = Handler::new();
    let stopped = consumer
        .run(&broker, handler.run(), std::future::pending())
        .await
        .expect("no broker error");
    assert_eq!(stopped, Stopped::Ended);
    assert_eq!(handler.calls("slow"), 1);
    assert_eq!(
        broker.deliveries_made(),
        1,
        "each heartbeat pushed the visibility back; 20 s is four timeouts"
    );
    assert_eq!(broker.acked(), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_settles_what_is_in_flight_and_leaves_the_rest_with_the_broker() {
    let consumer = consumer();
    let broker = Arc::new(MemoryBroker::new().concurrency(2));
    for n in 0..5 {
        broker.publish(order(&format!("o-{n}"), "{}"));
    }
    let started = Arc::new(AtomicU32::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handler = {
        let started = Arc::clone(&started);
        move |_job: Job<MemoryMessage>| {
            started.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, Io>(())
            }
        }
    };
    let run = tokio::spawn({
        let (consumer, broker) = (consumer.clone(), Arc::clone(&broker));
        async move {
            consumer
                .run(&broker, handler, async {
                    stopped.await.ok();
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.send(()).expect("the run is waiting");
    let why = run.await.expect("task").expect("no broker error");
    assert_eq!(why, Stopped::Shutdown);
    assert_eq!(started.load(Ordering::SeqCst), 2, "two in flight, no more");
    assert_eq!(broker.acked(), 2, "those in flight finished and were acked");
    assert_eq!(broker.unsettled(), 3, "the rest stay with the broker");
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_dies_leaves_its_delivery_to_come_back_after_the_visibility() {
    let broker = MemoryBroker::new().visibility(Duration::from_secs(3));
    broker.publish(order("o-1", "{}"));
    broker.close();
    let started = tokio::time::Instant::now();
    let first = broker.next().await.expect("a delivery");
    assert_eq!(first.delivery_count(), Some(1));
    let again = broker.next().await.expect("delivered again");
    assert_eq!(again.delivery_count(), Some(2));
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert!(
        broker.ack(&first).await.is_err(),
        "the first delivery's receipt is stale"
    );
    broker
        .ack(&again)
        .await
        .expect("the live delivery is acked");
    assert!(broker.next().await.is_none(), "closed and settled");
}
