//! Bad input and damaged data get typed errors, never a panic, and never a
//! change to what is stored.

use std::time::Duration;

mod common;

use common::server;
use idem::{
    ClaimMany, ClaimParams, GetRecord, ListQuery, ListRecords, RecordId, Store, StoreError,
};
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

/// A replica timeout the response timeout would cut short (every write
/// would time out before its replicas answer) is refused when the store
/// is built, as a zero one is; `replicas=0` turns acknowledgements off.
#[tokio::test]
async fn replica_timeouts_the_response_timeout_would_cut_short_are_refused() {
    let url = server().url();
    for (acks, why) in [
        (
            "replicas=1&replica_timeout=2s",
            "2s, the default response timeout",
        ),
        ("replicas=1&replica_timeout=3s&response_timeout=1s", "above"),
        ("replicas=1&replica_timeout=0ms", "zero"),
    ] {
        let err = RedisStore::connect(&format!("{url}?{acks}"))
            .await
            .expect_err(why);
        assert!(
            matches!(&err, ConnectError::InvalidSetting(m) if m.contains("replica timeout")),
            "{acks}: {err:?}"
        );
    }
    let err = RedisStore::connect(&format!("{url}?replicas=many"))
        .await
        .expect_err("not a number");
    assert!(matches!(err, ConnectError::InvalidUrl { .. }), "{err:?}");
    RedisStore::connect(&format!("{url}?replicas=0&replica_timeout=5s"))
        .await
        .expect("replicas=0 is off, whatever the timeout");
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

/// Writes `value` as the hash field `field` of `key` (a record's packed
/// fields are its field `m`, see `lua/prelude.lua`).
async fn write_field(key: &str, field: &str, value: &[u8]) {
    let client = redis::Client::open(server().url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: i64 = redis::cmd("HSET")
        .arg(key)
        .arg(field)
        .arg(value)
        .query_async(&mut conn)
        .await
        .expect("hset");
}

/// The packed fields of a record in state `st`, otherwise well formed.
fn packed(st: u8) -> Vec<u8> {
    let mut m = vec![st];
    m.extend(1u32.to_be_bytes());
    for n in [1.0f64, 1.0, 1.0, 99_999_999_999_999.0, 0.0] {
        m.extend(n.to_be_bytes());
    }
    m.extend([0, 0, 0]);
    m.extend(0u32.to_be_bytes());
    for text in ["errors", "damaged"] {
        m.extend(u32::try_from(text.len()).expect("short").to_be_bytes());
        m.extend(text.as_bytes());
    }
    m
}

#[tokio::test]
async fn a_damaged_record_reads_as_corrupt_naming_it_and_is_left_alone() {
    for (field, m, reason) in [
        ("m", packed(b'q'), "unknown state"),
        ("m", b"q-not-packed".to_vec(), "do not unpack"),
        // The field-per-value layout of builds before the packed record.
        ("st", b"c".to_vec(), "no packed record"),
    ] {
        let namespace = format!("err-{:016x}", rand::random::<u64>());
        let connect = |batching: bool| {
            RedisStore::builder(&server().url())
                .expect("valid URL")
                .namespace(namespace.clone())
                .batching(batching)
                .connect()
        };
        let store = connect(true).await.expect("connect");
        let unbatched = connect(false).await.expect("connect");
        let id = RecordId::parse("errors", "damaged").expect("valid");
        let key = store.record_key(&id);
        write_field(&key, field, &m).await;
        match store.get(&id).await {
            Err(StoreError::Corrupt {
                id: named,
                reason: why,
            }) => {
                assert_eq!(named, id.to_string());
                assert!(why.contains(reason), "{why}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let claim = store.claim(&id, &params()).await;
        assert!(
            matches!(&claim, Err(StoreError::Corrupt { id: named, .. }) if *named == id.to_string()),
            "{claim:?}"
        );
        for store in [&store, &unbatched] {
            let many = store
                .claim_many(&[(id.clone(), params())])
                .await
                .expect("a batch");
            assert!(
                matches!(&many[..], [Err(StoreError::Corrupt { id: named, .. })] if *named == id.to_string()),
                "{many:?}"
            );
        }
        let listed = store
            .list(&ListQuery::new(10))
            .await
            .expect_err("a list that meets a damaged record says so");
        assert!(matches!(listed, StoreError::Corrupt { .. }), "{listed:?}");
        let fields = server().cli(&format!("HLEN {key}")).expect("hlen");
        assert_eq!(fields.trim(), "1", "the damaged record was rewritten");
        let stored = server()
            .cli(&format!("HSTRLEN {key} {field}"))
            .expect("hstrlen");
        assert_eq!(
            stored.trim(),
            m.len().to_string(),
            "the damaged record was rewritten"
        );
    }
}
