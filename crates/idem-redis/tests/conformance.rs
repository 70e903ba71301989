//! The conformance suite against a real standalone Redis, started for this
//! test run on a free loopback port. Each case gets its own namespace.

use std::sync::OnceLock;

use idem_redis::RedisStore;
use idem_testkit::redis::RedisServer;
use idem_testkit::Fixture;

fn server() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start().expect("start redis-server"))
}

async fn fixture(case: &'static str) -> Fixture<RedisStore> {
    let store = RedisStore::builder(&server().url())
        .expect("valid URL")
        .namespace(format!("conf-{:016x}", rand::random::<u64>()))
        .connect()
        .await
        .expect("connect");
    Fixture::real_time(store, case)
}

idem_testkit::conformance_suite!(fixture);
