//! Bad input and damaged data get typed errors, never a panic, and never a
//! change to what is stored.

use std::time::Duration;

mod common;

use common::server;
use idem::{ClaimParams, GetRecord, ListQuery, ListRecords, RecordId, Store, StoreError};
use idem_redis::{ConnectError, RedisStore};

async fn store() -> RedisStore {
    common::store("err").await
}

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

#[tokio::test]
async fn bad_urls_and_namespaces_are_refused_before_connecting() {
    for url in [
        "localhost:6379",
        "http://127.0.0.1:6379",
        "redis+cluster://",
    ] {
        let err = RedisStore::connect(url).await.expect_err(url);
        assert!(
            matches!(err, ConnectError::InvalidUrl { .. }),
            "{url}: {err:?}"
        );
    }
    for namespace in ["", "has space", "glob*", "{tag}", &"n".repeat(65)] {
        let err = RedisStore::builder(&server().url())
            .expect("valid URL")
            .namespace(namespace)
            .connect()
            .await
            .expect_err(namespace);
        assert!(
            matches!(err, ConnectError::InvalidNamespace(_)),
            "{namespace:?}: {err:?}"
        );
    }
}

#[tokio::test]
async fn a_key_of_another_type_is_a_backend_error_and_is_left_alone() {
    let store = store().await;
    let id = RecordId::parse("errors", "string").expect("valid");
    let key = store.record_key(&id);
    server().cli(&format!("SET {key} not-a-hash")).expect("set");
    let claim = store.claim(&id, &params()).await;
    assert!(matches!(claim, Err(StoreError::Backend(_))), "{claim:?}");
    assert_eq!(
        server().cli(&format!("GET {key}")).expect("get").trim(),
        "not-a-hash"
    );
}

#[tokio::test]
async fn a_damaged_record_reads_as_corrupt_naming_it() {
    let store = store().await;
    let id = RecordId::parse("errors", "damaged").expect("valid");
    let key = store.record_key(&id);
    server()
        .cli(&format!(
            "HSET {key} s errors k damaged st q at 1 fe 1 ca 1 ua 1 ex 99999999999999"
        ))
        .expect("hset");
    match store.get(&id).await {
        Err(StoreError::Corrupt { id: named, reason }) => {
            assert_eq!(named, id.to_string());
            assert!(reason.contains("state"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let listed = store
        .list(&ListQuery::new(10))
        .await
        .expect_err("a list that meets a damaged record says so");
    assert!(matches!(listed, StoreError::Corrupt { .. }), "{listed:?}");
}
