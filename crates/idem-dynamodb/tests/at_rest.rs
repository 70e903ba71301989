//! A sealed, key-hashed run leaves nothing readable in the table: a scan
//! of every item, every attribute (docs/design.md §11).

mod common;

use idem_testkit::at_rest::{assert_hidden, write_secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_the_table_shows_no_sealed_payload_and_no_hashed_key() {
    let (client, table) = common::table("atrest").await;
    let store = idem_dynamodb::DynamoStore::new(client.clone(), table.clone());
    write_secrets(store, "pay").await;
    let items = client
        .scan()
        .table_name(&table)
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default();
    assert!(!items.is_empty(), "the table has items");
    // Every attribute as Rust prints it: strings as text, bytes as blobs
    // of their bytes.
    let mut dump = Vec::new();
    for item in items {
        for (name, value) in item {
            dump.extend_from_slice(name.as_bytes());
            dump.extend(attribute_bytes(&value));
        }
    }
    assert_hidden(&dump, "pay");
}

fn attribute_bytes(value: &aws_sdk_dynamodb::types::AttributeValue) -> Vec<u8> {
    use aws_sdk_dynamodb::types::AttributeValue as A;
    match value {
        A::S(s) | A::N(s) => s.as_bytes().to_vec(),
        A::B(b) => b.as_ref().to_vec(),
        A::M(map) => map
            .iter()
            .flat_map(|(k, v)| k.as_bytes().iter().copied().chain(attribute_bytes(v)))
            .collect(),
        A::L(list) => list.iter().flat_map(attribute_bytes).collect(),
        other => format!("{other:?}").into_bytes(),
    }
}
