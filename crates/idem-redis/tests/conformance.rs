//! The conformance suite against a real standalone Redis, started for this
//! test run on a free loopback port. Each case gets its own namespace.

mod common;

use idem_redis::RedisStore;
use idem_testkit::Fixture;

async fn fixture(case: &'static str) -> Fixture<RedisStore> {
    Fixture::real_time(common::store("conf").await, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, pending);

/// A store whose namespace remembers expired keys, for the horizon cases
/// (the URL's `remember=`, as `--remember-expired` gives it).
async fn remembering(case: &'static str) -> Fixture<RedisStore> {
    let memory = idem_testkit::conformance::horizon::MEMORY;
    let url = format!(
        "{}?remember={}ms",
        common::server().url(),
        memory.as_millis()
    );
    let store = RedisStore::builder(&url)
        .expect("valid URL")
        .namespace(format!("horizon-{:016x}", rand::random::<u64>()))
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
