//! A sealed, key-hashed run leaves nothing readable in Redis: every key
//! of the store's namespace (`SCAN`) and every value under it, read by
//! its type (docs/design.md §11).

mod common;

use idem_testkit::at_rest::{assert_hidden, write_secrets};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_every_key_and_value_shows_no_sealed_payload_and_no_hashed_key() {
    let store = common::store("atrest").await;
    write_secrets(store.clone(), "pay").await;
    let pattern = format!("*{}*", store.namespace());
    let keys: Vec<Vec<u8>> = common::query(redis::cmd("KEYS").arg(&pattern)).await;
    assert!(!keys.is_empty(), "the namespace has keys");
    let mut dump = Vec::new();
    for key in keys {
        let kind: String = common::query(redis::cmd("TYPE").arg(&key)).await;
        let values: Vec<Vec<u8>> = match kind.as_str() {
            "string" => vec![common::query(redis::cmd("GET").arg(&key)).await],
            "hash" => common::query(redis::cmd("HGETALL").arg(&key)).await,
            "zset" => {
                common::query(
                    redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES"),
                )
                .await
            }
            "set" => common::query(redis::cmd("SMEMBERS").arg(&key)).await,
            "list" => common::query(redis::cmd("LRANGE").arg(&key).arg(0).arg(-1)).await,
            other => panic!("a key of type {other} the test does not read"),
        };
        dump.extend_from_slice(&key);
        for value in values {
            dump.extend(value);
        }
    }
    assert_hidden(&dump, "pay");
}
