//! The conformance suite against `MemoryStore` on a manual clock.

use idem::{ManualClock, MemoryStore};
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<MemoryStore<ManualClock>> {
    let clock = ManualClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    Fixture::manual(store, clock, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, pending, ttl);

/// A store that remembers expired keys, for the horizon cases.
async fn remembering(case: &'static str) -> Fixture<MemoryStore<ManualClock>> {
    let clock = ManualClock::default();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .remember_expired(idem_testkit::conformance::horizon::MEMORY)
        .build();
    Fixture::manual(store, clock, case)
}

mod horizon {
    use super::remembering;
    idem_testkit::conformance_suite!(remembering; horizon, horizon_days);
}
