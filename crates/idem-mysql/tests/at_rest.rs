//! A sealed, key-hashed run leaves nothing readable in the store's
//! tables: every column of every row of every table of its database
//! (docs/design.md §11).

mod common;

use idem_testkit::at_rest::{assert_hidden, write_secrets};
use mysql_async::prelude::Queryable;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_of_every_table_shows_no_sealed_payload_and_no_hashed_key() {
    let url = common::url("atrest");
    let store = idem_mysql::MySqlStore::builder(&url)
        .expect("valid URL")
        .connect()
        .await
        .expect("connect");
    write_secrets(store.clone(), "pay").await;
    let pool = mysql_async::Pool::new(url.as_str());
    let mut conn = pool.get_conn().await.expect("connect");
    let tables: Vec<String> = conn
        .exec(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
            (store.database(),),
        )
        .await
        .expect("tables");
    assert!(!tables.is_empty(), "the database has tables");
    let mut dump = Vec::new();
    for table in tables {
        let rows: Vec<mysql_async::Row> = conn
            .query(format!("SELECT * FROM `{table}`"))
            .await
            .expect("select");
        for row in rows {
            for value in row.unwrap() {
                if let mysql_async::Value::Bytes(bytes) = value {
                    dump.extend(bytes);
                }
            }
        }
    }
    drop(conn);
    pool.disconnect().await.expect("disconnect");
    assert_hidden(&dump, "pay");
}
