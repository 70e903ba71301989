//! What the test files share: one redis-server for the whole test binary,
//! and stores that each get a namespace of their own.

use idem_redis::RedisStore;
use idem_testkit::servers::redis::RedisServer;

/// The test binary's redis-server, started on first use; it is killed when
/// the binary exits (see `idem_testkit::servers::redis`).
pub(crate) fn server() -> &'static RedisServer {
    RedisServer::shared().expect("redis-server")
}

/// A store on [`server`] in a fresh namespace `PREFIX-<random>`.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub(crate) async fn store(prefix: &str) -> RedisStore {
    RedisStore::builder(&server().url())
        .expect("valid URL")
        .namespace(format!("{prefix}-{:016x}", rand::random::<u64>()))
        .connect()
        .await
        .expect("connect")
}

/// A command on [`server`] through the `redis` crate (binary-safe, unlike
/// `redis-cli`), for tests that write or read a record's raw bytes.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub(crate) async fn query<T: redis::FromRedisValue>(cmd: &redis::Cmd) -> T {
    let client = redis::Client::open(server().url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    cmd.query_async(&mut conn).await.expect("query")
}
