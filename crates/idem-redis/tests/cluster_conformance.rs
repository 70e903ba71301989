//! The conformance suite against a real 3-master Redis Cluster, started for
//! this test run on free loopback ports. The same scripts as on one server.

use std::sync::OnceLock;

use idem_redis::RedisStore;
use idem_testkit::servers::redis::RedisCluster;
use idem_testkit::Fixture;

fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start().expect("start a Redis Cluster"))
}

async fn fixture(case: &'static str) -> Fixture<RedisStore> {
    let url = cluster().url();
    let store = RedisStore::builder(&url)
        .expect("valid URL")
        .namespace(format!("conf-{:016x}", rand::random::<u64>()))
        .connect()
        .await
        .expect("connect");
    assert!(store.is_cluster());
    Fixture::real_time(store, case)
}

idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, pending);

/// A Cluster store that remembers expired keys, for the horizon cases and
/// the step journal's (a journaled record's completion declares its
/// memory and, when the script asks, its journal too).
async fn remembering(case: &'static str) -> Fixture<RedisStore> {
    let memory = idem_testkit::conformance::horizon::MEMORY;
    let store = RedisStore::builder(&cluster().url())
        .expect("valid URL")
        .namespace(format!("horizon-{:016x}", rand::random::<u64>()))
        .remember_expired(memory)
        .connect()
        .await
        .expect("connect");
    assert!(store.is_cluster());
    assert_eq!(store.remembers_expired(), Some(memory));
    Fixture::real_time(store, case)
}

mod horizon {
    use super::remembering;
    idem_testkit::conformance_suite!(remembering; horizon, steps);
}
