//! The conformance suite against a real PostgreSQL, started for this test
//! run on a free loopback port. Each case gets its own schema.

mod common;

use idem_postgres::PgStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<PgStore> {
    Fixture::real_time(common::store("conf").await, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, ttl);
