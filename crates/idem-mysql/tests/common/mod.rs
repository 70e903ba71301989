//! What the test files share: one MariaDB server for the whole test
//! binary (started by the test, see `idem_testkit::servers::mysql`), and
//! stores that each get a database of their own.

use std::sync::OnceLock;

use idem_mysql::MySqlStore;
use idem_testkit::servers::mysql::MySqlServer;

/// The test binary's server, started on first use.
pub(crate) fn server() -> &'static MySqlServer {
    static SERVER: OnceLock<MySqlServer> = OnceLock::new();
    SERVER.get_or_init(|| MySqlServer::start().expect("start mariadb"))
}

/// The URL of a new database `PREFIX_<random>`.
#[allow(dead_code)]
pub(crate) fn url(prefix: &str) -> String {
    let server = server();
    let db = server.create_database(prefix).expect("create database");
    server.url(&db)
}

/// A store in a new database.
#[allow(dead_code)]
pub(crate) async fn store(prefix: &str) -> MySqlStore {
    MySqlStore::builder(&url(prefix))
        .expect("valid URL")
        .pool_size(8)
        .connect()
        .await
        .expect("connect")
}
