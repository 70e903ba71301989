//! The conformance suite against a real standalone Redis, started for this
//! test run on a free loopback port. Each case gets its own namespace.

mod common;

use idem_redis::RedisStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<RedisStore> {
    Fixture::real_time(common::store("conf").await, case)
}

idem_testkit::conformance_suite!(fixture);
