//! The conformance suite against a real MariaDB, started for this test
//! run on a free loopback port. Each case gets its own database.

mod common;

use idem_mysql::MySqlStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<MySqlStore> {
    Fixture::real_time(common::store("conf").await, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, ttl);

/// A store whose database remembers expired keys, for the horizon cases
/// (the URL's `remember=`, as the gateway's default gives it).
async fn remembering(case: &'static str) -> Fixture<MySqlStore> {
    let memory = idem_testkit::conformance::horizon::MEMORY;
    let url = format!(
        "{}?remember={}ms",
        common::url("remember"),
        memory.as_millis()
    );
    let store = MySqlStore::builder(&url)
        .expect("valid URL")
        .pool_size(8)
        .connect()
        .await
        .expect("connect");
    assert_eq!(store.remembers_expired(), Some(memory));
    Fixture::real_time(store, case)
}

mod horizon {
    use super::remembering;
    idem_testkit::conformance_suite!(remembering; horizon);
}
