//! The conformance suite against a real DynamoDB-compatible server
//! (moto_server, started for this test run on a free loopback port), with
//! a manual clock and a table per case: exact counts, and leases and
//! retention that run out without sleeping. `behaviour.rs` runs leases out
//! on the system clock.

mod common;

use idem::ManualClock;
use idem_dynamodb::DynamoStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<DynamoStore> {
    let clock = ManualClock::default();
    // No grace: one clock here, so purge may drop an expired item as soon
    // as the clock has passed its fence (`behaviour.rs` proves the grace
    // against clocks that disagree).
    let store = common::store(case)
        .await
        .with_clock(clock.clone())
        .with_grace(std::time::Duration::ZERO);
    Fixture::manual(store, clock, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, ttl);
