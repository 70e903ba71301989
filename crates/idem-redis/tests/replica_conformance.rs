//! The conformance suite with every write waiting for a replica
//! (`replica_acks`): on one server with a replica (batched calls and
//! pipelines carry the `WAIT`) and on a Cluster of three masters with a
//! replica each (the store follows redirections itself).

use std::sync::OnceLock;
use std::time::Duration;

use idem_redis::RedisStore;
use idem_testkit::servers::redis::{ClusterSpec, RedisCluster, RedisServer};
use idem_testkit::Fixture;

async fn fixture(url: String, case: &'static str) -> Fixture<RedisStore> {
    let store = RedisStore::builder(&url)
        .expect("valid URL")
        .namespace(format!("conf-{:016x}", rand::random::<u64>()))
        .replica_acks(1, Duration::from_secs(1))
        .connect()
        .await
        .expect("connect");
    // Each call waits for a replica too, on two cores shared with six
    // Cluster nodes and the other cases: more than the default 600 ms.
    Fixture::real_time(store, case).with_lease(Duration::from_millis(1200))
}

mod one_server {
    use super::*;

    fn servers() -> &'static (RedisServer, RedisServer) {
        static SERVERS: OnceLock<(RedisServer, RedisServer)> = OnceLock::new();
        SERVERS.get_or_init(|| {
            let port = idem_testkit::free_port().expect("port");
            let master = RedisServer::start_with(port, &["--repl-diskless-sync-delay", "0"])
                .expect("redis-server");
            let replica = RedisServer::replica_of(&master, &[]).expect("replica");
            (master, replica)
        })
    }

    async fn fixture(case: &'static str) -> Fixture<RedisStore> {
        super::fixture(servers().0.url(), case).await
    }

    idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, pending);
}

mod cluster {
    use super::*;

    fn cluster() -> &'static RedisCluster {
        static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| {
            RedisCluster::start_with(ClusterSpec {
                replicas: 1,
                ..ClusterSpec::default()
            })
            .expect("a Redis Cluster with replicas")
        })
    }

    async fn fixture(case: &'static str) -> Fixture<RedisStore> {
        super::fixture(cluster().url(), case).await
    }

    idem_testkit::conformance_suite!(fixture; core, concurrency, batches, admin, steps, outbox, pending);
}
