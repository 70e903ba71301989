//! What a Redis store that remembers expired keys writes and keeps, on a
//! real redis-server: the memory beside a record that ended (its bytes
//! and its expiry, the end of the record's day plus the memory), what a
//! delete and a release forget, and the setting shared by every store on
//! the namespace.

mod common;

use std::time::Duration;

use idem::horizon::DAY_MS;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{
    DeleteRecord, Failure, FailureClass, Fingerprint, GetRecord, RecordId, Resolution, Resolved,
    StepJournal, Store,
};
use idem_redis::RedisStore;

const MEMORY: Duration = Duration::from_secs(3 * 86_400);
const RETENTION: Duration = Duration::from_millis(400);

async fn store(namespace: &str, remember: Option<&str>) -> RedisStore {
    let url = match remember {
        Some(memory) => format!("{}?remember={memory}", common::server().url()),
        None => common::server().url(),
    };
    RedisStore::builder(&url)
        .expect("valid URL")
        .namespace(namespace)
        .connect()
        .await
        .expect("connect")
}

fn params(request: &[u8]) -> ClaimParams {
    ClaimParams::new(Duration::from_secs(5), RETENTION).fingerprint(Fingerprint::of_bytes(request))
}

async fn acquire(store: &RedisStore, id: &RecordId, p: &ClaimParams) -> Lease {
    match store.claim(id, p).await.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("{id} is acquired, got {other:?}"),
    }
}

async fn memory_of(store: &RedisStore, id: &RecordId) -> Option<Vec<u8>> {
    common::query(redis::cmd("GET").arg(format!("{}:h", store.record_key(id)))).await
}

#[tokio::test]
async fn a_record_that_ends_leaves_its_day_and_fingerprint_for_the_memory() {
    let namespace = format!("mem-{:016x}", rand::random::<u64>());
    let store = store(&namespace, Some("3d")).await;
    let id = RecordId::parse("orders", "o-1").expect("valid id");
    let p = params(b"charge 10");
    let lease = acquire(&store, &id, &p).await;
    assert_eq!(memory_of(&store, &id).await, None, "nothing while it runs");
    store
        .complete(&lease, "ok".into(), RETENTION)
        .await
        .expect("complete");
    let expires_at = store.get(&id).await.expect("get").expect("held").expires_at;
    let day = expires_at.as_millis() / DAY_MS;
    let stored = memory_of(&store, &id).await.expect("remembered");
    let mut wanted = u32::try_from(day).expect("a day").to_be_bytes().to_vec();
    wanted.extend_from_slice(&p.fingerprint.expect("set").to_hex().as_bytes()[..16]);
    assert_eq!(
        stored, wanted,
        "the day (4 bytes) and 16 hex digits of the fingerprint"
    );
    let until: i64 =
        common::query(redis::cmd("PEXPIRETIME").arg(format!("{}:h", store.record_key(&id)))).await;
    let end = (day + 1) * DAY_MS + u64::try_from(MEMORY.as_millis()).expect("ms");
    assert_eq!(
        until,
        i64::try_from(end).expect("ms"),
        "kept the memory past the day"
    );
}

#[tokio::test]
async fn deleting_a_live_record_or_releasing_a_parked_one_forgets_it() {
    let namespace = format!("mem-{:016x}", rand::random::<u64>());
    let store = store(&namespace, Some("3d")).await;
    let p = params(b"request");
    let deleted = RecordId::parse("orders", "deleted").expect("valid id");
    let lease = acquire(&store, &deleted, &p).await;
    store
        .complete(&lease, "ok".into(), RETENTION)
        .await
        .expect("complete");
    assert!(memory_of(&store, &deleted).await.is_some());
    assert!(store.delete(&deleted).await.expect("delete"), "it was live");
    assert_eq!(memory_of(&store, &deleted).await, None, "a delete forgets");

    let parked = RecordId::parse("orders", "parked").expect("valid id");
    let lease = acquire(&store, &parked, &p).await;
    store.begin_step(&lease, "charge").await.expect("begin");
    store
        .fail(
            &lease,
            Failure::new(FailureClass::Unknown, "cut off in a step"),
            RETENTION,
        )
        .await
        .expect("fail");
    assert!(
        memory_of(&store, &parked).await.is_some(),
        "a failed record is remembered"
    );
    let resolved = store
        .resolve_step(&parked, "charge", Resolution::NotApplied)
        .await
        .expect("resolve");
    assert_eq!(resolved, Resolved::Released);
    assert_eq!(
        memory_of(&store, &parked).await,
        None,
        "a released record is not"
    );

    tokio::time::sleep(RETENTION + Duration::from_millis(200)).await;
    acquire(&store, &deleted, &p).await;
    acquire(&store, &parked, &p).await;
}

#[tokio::test]
async fn every_store_on_the_namespace_remembers_alike_until_it_is_turned_off() {
    let namespace = format!("mem-{:016x}", rand::random::<u64>());
    assert_eq!(
        store(&namespace, None).await.remembers_expired(),
        None,
        "off by default"
    );
    let first = store(&namespace, Some("3d")).await;
    assert_eq!(first.remembers_expired(), Some(MEMORY));
    let other = store(&namespace, None).await;
    assert_eq!(
        other.remembers_expired(),
        Some(MEMORY),
        "read from the namespace"
    );

    let id = RecordId::parse("orders", "shared").expect("valid id");
    let p = params(b"request");
    let lease = acquire(&other, &id, &p).await;
    other
        .complete(&lease, "ok".into(), RETENTION)
        .await
        .expect("complete");
    tokio::time::sleep(RETENTION + Duration::from_millis(200)).await;
    assert!(
        matches!(
            first.claim(&id, &p).await.expect("claim"),
            ClaimOutcome::Forgotten { .. }
        ),
        "remembered by the store that did not say so itself"
    );

    let off = store(&namespace, Some("0s")).await;
    assert_eq!(off.remembers_expired(), None);
    assert_eq!(
        store(&namespace, None).await.remembers_expired(),
        None,
        "turned off for all"
    );
    let late = RecordId::parse("orders", "after").expect("valid id");
    let lease = acquire(&off, &late, &p).await;
    off.complete(&lease, "ok".into(), RETENTION)
        .await
        .expect("complete");
    assert_eq!(
        memory_of(&off, &late).await,
        None,
        "nothing remembered once off"
    );
}
