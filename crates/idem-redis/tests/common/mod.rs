//! What the test files share: one redis-server for the whole test binary,
//! and stores that each get a namespace of their own.

use idem_redis::RedisStore;
use idem_testkit::redis::RedisServer;

/// The test binary's redis-server, started on first use; it is killed when
/// the binary exits (see `idem_testkit::redis`).
pub(crate) fn server() -> &'static RedisServer {
    RedisServer::shared().expect("redis-server")
}

/// A store on [`server`] in a fresh namespace `PREFIX-<random>`.
pub(crate) async fn store(prefix: &str) -> RedisStore {
    RedisStore::builder(&server().url())
        .expect("valid URL")
        .namespace(format!("{prefix}-{:016x}", rand::random::<u64>()))
        .connect()
        .await
        .expect("connect")
}
