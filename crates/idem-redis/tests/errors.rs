//! Bad input and damaged data get typed errors, never a panic, and never a
//! change to what is stored.

use std::time::Duration;

mod common;

use common::{query, server};
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{
    ClaimMany, Failure, FailureClass, GetRecord, ListQuery, ListRecords, RecordId, Store,
    StoreError,
};
use idem_redis::{ConnectError, RedisStore};

async fn store() -> RedisStore {
    common::store("err").await
}

/// A store on `namespace` of the shared server, its calls batched or
/// each a script call of its own.
async fn store_on(namespace: &str, batching: bool) -> RedisStore {
    RedisStore::builder(&server().url())
        .expect("valid URL")
        .namespace(namespace)
        .batching(batching)
        .connect()
        .await
        .expect("connect")
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
    server()
        .cli(&format!("RPUSH {key} not-a-record"))
        .expect("rpush");
    let claim = store.claim(&id, &params()).await;
    assert!(matches!(claim, Err(StoreError::Backend(_))), "{claim:?}");
    assert_eq!(
        server()
            .cli(&format!("LRANGE {key} 0 -1"))
            .expect("lrange")
            .trim(),
        "not-a-record"
    );
}

/// A damaged record as it is written to Redis.
enum Damaged {
    /// The record value itself (a string, today's layout).
    Value(Vec<u8>),
    /// One field of a hash (the layouts of earlier builds).
    Field(&'static str, Vec<u8>),
}

/// Writes `damaged` at `key`.
async fn write(key: &str, damaged: &Damaged) {
    let _: redis::Value = match damaged {
        Damaged::Value(m) => query(redis::cmd("SET").arg(key).arg(m)).await,
        Damaged::Field(field, m) => query(redis::cmd("HSET").arg(key).arg(field).arg(m)).await,
    };
}

/// The fields of a record in state `st` in the layout that builds before
/// 2026-11-24 kept in the hash field `m`, otherwise well formed.
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

/// A record in state `st` in today's layout (`lua/prelude.lua`): the
/// fields above, then the generation, the waiter and journal flags, and
/// an empty response.
fn packed_value(st: u8) -> Vec<u8> {
    let mut m = packed(st);
    m.extend(1.0f64.to_be_bytes());
    m.extend([0, 0]);
    m.extend(0u32.to_be_bytes());
    m
}

#[tokio::test]
async fn a_damaged_record_reads_as_corrupt_naming_it_and_is_left_alone() {
    for (damaged, reason) in [
        (Damaged::Value(packed_value(b'q')), "unknown state"),
        (Damaged::Value(b"q-not-packed".to_vec()), "do not unpack"),
        (Damaged::Field("m", packed(b'q')), "unknown state"),
        (
            Damaged::Field("m", b"q-not-packed".to_vec()),
            "do not unpack",
        ),
        // The field-per-value layout of builds before the packed record.
        (Damaged::Field("st", b"c".to_vec()), "no packed record"),
    ] {
        let namespace = format!("err-{:016x}", rand::random::<u64>());
        let store = store_on(&namespace, true).await;
        let unbatched = store_on(&namespace, false).await;
        let id = RecordId::parse("errors", "damaged").expect("valid");
        let key = store.record_key(&id);
        write(&key, &damaged).await;
        let before: Vec<u8> = query(redis::cmd("DUMP").arg(&key)).await;
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
        let after: Vec<u8> = query(redis::cmd("DUMP").arg(&key)).await;
        assert_eq!(before, after, "the damaged record was rewritten");
    }
}

/// A holder's end (a completion, a failure) that meets a record which
/// does not read back says `Corrupt`, naming it, and writes nothing, on
/// the batched path and on the script of its own: the scripts' fast path
/// for ending a record leaves such a record to the full read, which
/// calls it damaged.
#[tokio::test]
async fn a_holder_ending_a_damaged_record_gets_corrupt_and_writes_nothing() {
    for batching in [true, false] {
        for damaged in [packed_value(b'q'), b"p-not-packed".to_vec()] {
            let namespace = format!("err-{:016x}", rand::random::<u64>());
            let store = store_on(&namespace, batching).await;
            let id = RecordId::parse("errors", "ended").expect("valid");
            let Ok(ClaimOutcome::Acquired(lease)) = store.claim(&id, &params()).await else {
                panic!("a fresh key is acquired");
            };
            let key = store.record_key(&id);
            write(&key, &Damaged::Value(damaged.clone())).await;
            let before: Vec<u8> = query(redis::cmd("DUMP").arg(&key)).await;
            let completed = store
                .complete(&lease, "done".into(), Duration::from_secs(60))
                .await;
            let failed = store
                .fail(
                    &lease,
                    Failure::new(FailureClass::Terminal, "no"),
                    Duration::from_secs(60),
                )
                .await;
            for ended in [completed, failed] {
                assert!(
                    matches!(&ended, Err(StoreError::Corrupt { id: named, .. }) if *named == id.to_string()),
                    "batching {batching}: {ended:?}"
                );
            }
            let after: Vec<u8> = query(redis::cmd("DUMP").arg(&key)).await;
            assert_eq!(before, after, "the damaged record was rewritten");
        }
    }
}

/// Errors after which the command did not run and a later try can
/// succeed are [`StoreError::Unavailable`] (retried within the lease and
/// read back), never a definite refusal that would end a run whose effect
/// happened (docs/design.md §5.5): memory full (`OOM`), too few replicas
/// (`NOREPLICAS`), a script running too long (`BUSY`). Each on a server of
/// its own, set up to answer so; once it is set back, the same claim
/// goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_full_too_few_replicas_and_busy_scripts_are_unavailable() {
    let redis = idem_testkit::servers::redis::RedisServer::start_with(
        idem_testkit::free_port().expect("port"),
        &["--busy-reply-threshold", "100"],
    )
    .expect("redis-server");
    let store = RedisStore::builder(&redis.url())
        .expect("url")
        .namespace("transient")
        .connect()
        .await
        .expect("connect");
    let claim = |key: &str| {
        let id = RecordId::parse("transient", key).expect("id");
        let store = store.clone();
        async move { store.claim(&id, &params()).await }
    };
    for (key, set, unset) in [
        ("oom", "CONFIG SET maxmemory 1", "CONFIG SET maxmemory 0"),
        (
            "noreplicas",
            "CONFIG SET min-replicas-to-write 1",
            "CONFIG SET min-replicas-to-write 0",
        ),
    ] {
        redis.cli(set).expect("set");
        let refused = claim(key).await;
        assert!(
            matches!(refused, Err(StoreError::Unavailable(_))),
            "{set}: {refused:?}"
        );
        redis.cli(unset).expect("unset");
        claim(key).await.expect("claimed once set back");
    }

    // A script of another client's that runs past the threshold: the
    // server answers BUSY to everyone else until it is killed.
    let looping = tokio::task::spawn_blocking({
        let redis_url = redis.url();
        move || {
            let client = redis::Client::open(redis_url).expect("client");
            let mut conn = client.get_connection().expect("connection");
            let _: redis::RedisResult<()> = redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query(&mut conn);
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let busy = claim("busy").await;
    assert!(
        matches!(busy, Err(StoreError::Unavailable(_))),
        "BUSY: {busy:?}"
    );
    redis.cli("SCRIPT KILL").expect("kill the script");
    looping.await.expect("looping client");
    claim("busy")
        .await
        .expect("claimed once the script is gone");
}
