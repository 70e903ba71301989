//! The moto server the tests share, and a fresh table per test.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use idem::RecordId;
use idem_dynamodb::{client_for, create_table, DynamoStore};
use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};

/// The shared server, started on first use; serial, so that concurrent
/// conditional writes are atomic as in DynamoDB.
pub fn server() -> &'static MotoServer {
    MotoServer::shared_serial().expect(
        "moto_server must be installed (scripts/test installs it into ~/.cache/idem/tools/moto)",
    )
}

/// A client of the shared server.
pub fn client() -> Client {
    client_for(Some(&server().url()), REGION, ACCESS_KEY, SECRET_KEY, None).expect("client")
}

/// A table of its own for `name`, created now.
pub async fn table(name: &str) -> (Client, String) {
    let client = client();
    let table = format!(
        "idem-{}-{:08x}",
        name.replace('_', "-"),
        rand::random::<u32>()
    );
    create_table(&client, &table).await.expect("create table");
    (client, table)
}

/// A store on a table of its own.
pub async fn store(name: &str) -> DynamoStore {
    let (client, table) = table(name).await;
    DynamoStore::new(client, table)
}

/// The item of `id` as stored, read consistently past the store.
pub async fn item(store: &DynamoStore, id: &RecordId) -> Option<HashMap<String, AttributeValue>> {
    let pk = format!("{}\n{}", id.scope().as_str(), id.key().as_str());
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(pk))
        .consistent_read(true)
        .send()
        .await
        .expect("get item")
        .item
}
