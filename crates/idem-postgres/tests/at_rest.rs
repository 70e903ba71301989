//! A sealed, key-hashed run leaves nothing readable in the store's
//! tables: every row of every table of its schema, as PostgreSQL prints
//! it (`SELECT t::text`, bytes in hex) (docs/design.md §11).

mod common;

use idem_testkit::at_rest::{assert_hidden, write_secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_select_of_every_table_shows_no_sealed_payload_and_no_hashed_key() {
    let store = common::store("atrest").await;
    write_secrets(store.clone(), "pay").await;
    let (client, connection) = tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let tables = client
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
            &[&store.schema()],
        )
        .await
        .expect("tables");
    assert!(!tables.is_empty(), "the schema has tables");
    let mut dump = Vec::new();
    for table in tables {
        let name: String = table.get(0);
        let sql = format!("SELECT t::text FROM \"{}\".\"{name}\" t", store.schema());
        for row in client.query(&sql, &[]).await.expect("select") {
            let text: String = row.get(0);
            dump.extend_from_slice(text.as_bytes());
        }
    }
    assert_hidden(&dump, "pay");
}
