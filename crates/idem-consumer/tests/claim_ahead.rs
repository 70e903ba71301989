//! `ConsumerBuilder::claim_ahead`: the deliveries waiting together are
//! claimed in one `claim_many`, and each still settles exactly as it
//! would alone. Over the in-memory broker and the real in-memory store
//! (a double in front of it counts the store calls and fails one batch).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem::{Idempotency, MemoryStore, RecordId, Scope, StoreError};

use idem::store::{ClaimOutcome, ClaimParams};
use idem_consumer::{Consumer, Job, MemoryBroker, MemoryMessage, OwnedMessage, Stopped};
use idem_testkit::doubles::{Double, Hooks, ManyHooks};

/// Counts single claims and the size of every batch; fails the first
/// batch when told to.
#[derive(Default)]
struct Counting {
    singles: AtomicUsize,
    batches: Mutex<Vec<usize>>,
    fail_first_batch: AtomicBool,
}

impl Hooks<MemoryStore> for Counting {
    async fn claim(
        &self,
        inner: &MemoryStore,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        self.singles.fetch_add(1, Ordering::SeqCst);
        idem::Store::claim(inner, id, params).await
    }
}

impl ManyHooks<MemoryStore> for Counting {
    async fn claim_many(
        &self,
        inner: &MemoryStore,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        self.batches.lock().expect("lock").push(claims.len());
        if self.fail_first_batch.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the store is away".into()));
        }
        idem::ClaimMany::claim_many(inner, claims).await
    }
}

type Store = Arc<Double<MemoryStore, Counting>>;

fn consumer(store: &Store) -> Consumer<Store> {
    let idem = Idempotency::builder(Arc::clone(store))
        .build()
        .expect("config");
    Consumer::builder(idem, Scope::new("orders").expect("scope"))
        .claim_ahead()
        .build()
}

fn order(key: &str) -> OwnedMessage {
    OwnedMessage::new(format!(r#"{{"order":"{key}"}}"#)).with_header("Idempotency-Key", key)
}

/// Counts each key's handler calls.
fn handler(
    calls: &Arc<Mutex<HashMap<String, u32>>>,
) -> impl Fn(Job<MemoryMessage>) -> std::future::Ready<Result<(), std::io::Error>> + Send + Sync + 'static
{
    let calls = Arc::clone(calls);
    move |job| {
        *calls
            .lock()
            .expect("lock")
            .entry(job.key().as_str().to_owned())
            .or_default() += 1;
        std::future::ready(Ok(()))
    }
}

/// 32 orders, three of them delivered twice inside the first window, and
/// one delivery without a key, through a window of 16.
fn publish(broker: &MemoryBroker) {
    for i in 0..32 {
        broker.publish(order(&format!("o-{i}")));
        if i < 3 {
            broker.publish(order(&format!("o-{i}")));
        }
        if i == 5 {
            broker.publish(OwnedMessage::new("no key at all"));
        }
    }
    broker.close();
}

/// Publishes, runs `store`'s consumer until the broker is drained, and
/// checks what every run must keep: each order ran exactly once, every
/// delivery was settled.
async fn drain(store: &Store) -> (Consumer<Store>, Arc<MemoryBroker>) {
    let consumer = consumer(store);
    let broker = Arc::new(MemoryBroker::new().concurrency(16));
    publish(&broker);
    let calls = Arc::default();
    let stopped = consumer
        .run(&broker, handler(&calls), std::future::pending())
        .await
        .expect("the memory broker does not fail");
    assert_eq!(stopped, Stopped::Ended);
    assert_eq!(broker.unsettled(), 0, "every delivery was settled");
    let calls = calls.lock().expect("lock").clone();
    assert_eq!(calls.len(), 32, "no order was lost: {calls:?}");
    assert!(
        calls.values().all(|&n| n == 1),
        "every order ran exactly once: {calls:?}"
    );
    (consumer, broker)
}

#[tokio::test(start_paused = true)]
async fn a_window_is_claimed_in_one_call_and_each_delivery_settles_as_alone() {
    let store: Store = Arc::new(Double::new(MemoryStore::new(), Counting::default()));
    let (consumer, broker) = drain(&store).await;
    assert_eq!(broker.dead_letters().len(), 1, "the keyless delivery");
    let stats = consumer.stats();
    assert_eq!(stats.executed, 32);
    assert_eq!(stats.replayed, 3, "each duplicate replayed, once it could");
    let batches = store.hooks.batches.lock().expect("lock").clone();
    assert_eq!(
        batches.first(),
        Some(&15),
        "the first window (16 deliveries, one without a key) is one claim_many"
    );
    assert!(batches.iter().all(|&n| n <= 16), "{batches:?}");
}

#[tokio::test(start_paused = true)]
async fn a_window_whose_claim_fails_retries_every_delivery_and_loses_none() {
    let store: Store = Arc::new(Double::new(MemoryStore::new(), Counting::default()));
    store.hooks.fail_first_batch.store(true, Ordering::SeqCst);
    let (consumer, broker) = drain(&store).await;
    assert!(
        consumer.stats().retries >= 15,
        "the failed window's deliveries were retried (fail-closed), not acked"
    );
    assert_eq!(broker.dead_letters().len(), 1);
}
