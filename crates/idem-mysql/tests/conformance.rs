//! The conformance suite against a real MariaDB, started for this test
//! run on a free loopback port. Each case gets its own database.

mod common;

use idem_mysql::MySqlStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<MySqlStore> {
    Fixture::real_time(common::store("conf").await, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, ttl);
