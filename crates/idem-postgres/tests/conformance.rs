//! The conformance suite against a real PostgreSQL, started for this test
//! run on a free loopback port. Each case gets its own schema.

mod common;

use idem_postgres::PgStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<PgStore> {
    Fixture::real_time(common::store("conf").await, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, pending, ttl);

/// A store whose schema remembers expired keys, for the horizon cases.
async fn remembering(case: &'static str) -> Fixture<PgStore> {
    let store = PgStore::builder(&common::url())
        .expect("valid URL")
        .schema(format!("remember_{:016x}", rand::random::<u64>()))
        .pool_size(8)
        .remember_expired(idem_testkit::conformance::horizon::MEMORY)
        .connect()
        .await
        .expect("connect");
    Fixture::real_time(store, case)
}

mod horizon {
    use super::remembering;
    idem_testkit::conformance_suite!(remembering; horizon);
}
