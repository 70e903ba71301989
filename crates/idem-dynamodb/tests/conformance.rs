//! The conformance suite against a real DynamoDB-compatible server
//! (moto_server, started for this test run on a free loopback port), with
//! a manual clock and a table per case: exact counts, and leases and
//! retention that run out without sleeping. `behaviour.rs` runs leases out
//! on the system clock.

mod common;

use std::time::Duration;

use idem::ManualClock;
use idem_dynamodb::DynamoStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<DynamoStore> {
    opened(case, None).await
}

/// A store that remembers expired keys, for the horizon cases (and the
/// step journal's, whose writes of a whole item carry the memory).
async fn remembering(case: &'static str) -> Fixture<DynamoStore> {
    opened(case, Some(idem_testkit::conformance::horizon::MEMORY)).await
}

async fn opened(case: &'static str, memory: Option<Duration>) -> Fixture<DynamoStore> {
    let clock = ManualClock::default();
    // No grace: one clock here, so purge may drop an expired item as soon
    // as the clock has passed its fence (`behaviour.rs` proves the grace
    // against clocks that disagree).
    let mut store = common::store(case)
        .await
        .with_clock(clock.clone())
        .with_grace(Duration::ZERO);
    if let Some(memory) = memory {
        store = store.with_remember_expired(memory);
        assert_eq!(store.remembers_expired(), Some(memory));
    }
    Fixture::manual(store, clock, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, ttl);

mod horizon {
    use super::remembering;
    idem_testkit::conformance_suite!(remembering; horizon, horizon_days, steps);
}
