//! What the test files share: one PostgreSQL server for the whole test
//! binary (started by the test, see `idem_testkit::servers::postgres`), a database
//! made for this run, and stores that each get a schema of their own.

use std::sync::OnceLock;

use idem_postgres::PgStore;
use idem_testkit::servers::postgres::PgServer;

/// The test binary's server and this run's database, made on first use.
pub(crate) fn server() -> &'static (PgServer, String) {
    static SERVER: OnceLock<(PgServer, String)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = PgServer::start().expect("start postgres");
        let db = server
            .create_database("idem_test")
            .expect("create database");
        (server, db)
    })
}

/// The URL of this run's database.
#[allow(dead_code)]
pub(crate) fn url() -> String {
    let (server, db) = server();
    server.url(db)
}

/// A connection to this run's database, driven on a task of its own.
#[allow(dead_code)]
pub(crate) async fn client() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// A store in a fresh schema `PREFIX_<random>`.
#[allow(dead_code)]
pub(crate) async fn store(prefix: &str) -> PgStore {
    PgStore::builder(&url())
        .expect("valid URL")
        .schema(format!("{prefix}_{:016x}", rand::random::<u64>()))
        .pool_size(8)
        .connect()
        .await
        .expect("connect")
}
