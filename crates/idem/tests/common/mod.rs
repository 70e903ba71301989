//! What the outbox's tests share: a memory store on a manual clock, an
//! executor that sends through a given sender, and a broker that hangs.

use std::time::Duration;

use bytes::Bytes;
use idem::outbox::{MemorySender, Message, SendFuture, Sender};
use idem::{Idempotency, ManualClock, MemoryStore, RecordId, Store};

/// The runs' lease.
pub(crate) const LEASE: Duration = Duration::from_secs(10);

/// A memory store and the clock it reads.
pub(crate) fn store() -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::default();
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

/// An executor on `store` sending through `sender`, without a replay
/// cache.
pub(crate) fn executor<S: Store>(store: S, sender: impl Sender) -> Idempotency<S> {
    Idempotency::builder(store)
        .lease(LEASE)
        .replay_cache_bytes(0)
        .outbox(sender)
        .build()
        .expect("a valid executor")
}

/// The payloads `sender` sent, in order.
pub(crate) fn payloads(sender: &MemorySender) -> Vec<Bytes> {
    sender
        .messages()
        .iter()
        .map(|m| m.payload().clone())
        .collect()
}

/// A run of scope `orders`.
pub(crate) fn run_id(key: &str) -> RecordId {
    RecordId::parse("orders", key).expect("valid")
}

/// A broker that never answers: the process is "killed" while it waits.
pub(crate) struct Hangs;

impl Sender for Hangs {
    fn send<'a>(&'a self, _: &'a Message) -> SendFuture<'a> {
        Box::pin(std::future::pending())
    }
}
