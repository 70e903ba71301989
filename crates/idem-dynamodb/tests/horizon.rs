//! What a DynamoDB store that remembers expired keys writes and keeps, on
//! moto: the memory in the item of a record that ended (its attributes
//! and `sweep_at`), the tombstone the purge strips it to, a memory
//! honoured by a client that does not remember itself, carried under a
//! new request for the key, forgotten by a live delete, and deleted by the
//! purge only once DynamoDB's TTL has had its time.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use idem::horizon::DAY_MS;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{
    Clock, DeleteRecord, Failure, FailureClass, Fingerprint, GetRecord, ManualClock, PurgeExpired,
    RecordId, Resolution, Resolved, StepJournal, Store, Timestamp,
};
use idem_dynamodb::DynamoStore;

const MEMORY: Duration = Duration::from_secs(3 * 86_400);
const RETENTION: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

type Item = HashMap<String, AttributeValue>;

/// Two stores on one fresh table and one clock: the first remembers, the
/// second does not.
async fn stores(name: &str) -> (DynamoStore, DynamoStore, ManualClock) {
    let (client, table) = common::table(name).await;
    let clock = ManualClock::default();
    let plain = DynamoStore::new(client, table)
        .with_clock(clock.clone())
        .with_grace(Duration::ZERO);
    let remembering = plain.clone().with_remember_expired(MEMORY);
    (remembering, plain, clock)
}

fn params(request: &[u8]) -> ClaimParams {
    ClaimParams::new(Duration::from_secs(10), RETENTION).fingerprint(Fingerprint::of_bytes(request))
}

async fn acquire(store: &DynamoStore, id: &RecordId, p: &ClaimParams) -> Lease {
    match store.claim(id, p).await.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("{id} is acquired, got {other:?}"),
    }
}

fn number(item: &Item, name: &str) -> u64 {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|raw| raw.parse().ok())
        .unwrap_or_else(|| panic!("{name} is a number in {item:?}"))
}

async fn purge_all(store: &DynamoStore) {
    while store.purge_expired(1000).await.expect("purge") > 0 {}
}

/// The size DynamoDB bills for an item: attribute names and values (plus
/// 100 bytes of its own per item, not counted here).
fn size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    AttributeValue::S(s) => s.len(),
                    AttributeValue::N(n) => n.len().div_ceil(2) + 1,
                    AttributeValue::M(m) => 3 + m.len(),
                    _ => 1,
                }
        })
        .sum()
}

#[tokio::test]
async fn a_record_that_ends_keeps_its_memory_and_the_purge_strips_it_to_that() {
    let (store, _, clock) = stores("mem-ends").await;
    let id = RecordId::parse("orders", "o-1").expect("valid id");
    let p = params(b"charge 10");
    let lease = acquire(&store, &id, &p).await;
    store
        .complete(&lease, "a response".into(), RETENTION)
        .await
        .expect("complete");
    let expires_at = store.get(&id).await.expect("get").expect("held").expires_at;
    let day = expires_at.as_millis() / DAY_MS;
    let until = (day + 1) * DAY_MS + u64::try_from(MEMORY.as_millis()).expect("ms");
    let ended = common::item(&store, &id).await.expect("the item");
    assert_eq!(number(&ended, "hd"), day, "the day the retention ends");
    assert_eq!(
        ended.get("hf").and_then(|v| v.as_s().ok()),
        Some(&p.fingerprint.expect("set").to_hex()),
        "the fingerprint, copied by the update"
    );
    assert_eq!(
        number(&ended, "hu"),
        until,
        "kept to the day's end + memory"
    );
    assert_eq!(
        number(&ended, "sweep_at"),
        until.div_ceil(1000),
        "DynamoDB's TTL keeps the item as long"
    );

    clock.advance(RETENTION + Duration::from_secs(1));
    purge_all(&store).await;
    let stripped = common::item(&store, &id)
        .await
        .expect("a tombstone is left");
    let mut names: Vec<&str> = stripped.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["at", "ca", "ex", "fe", "hd", "hf", "hu", "j", "pk", "st", "sweep_at", "ua", "v"],
        "no response, no fingerprint but the memory's, the id only in pk"
    );
    assert_eq!(number(&stripped, "ex"), 0);
    assert_eq!(
        number(&stripped, "fe"),
        lease.fence,
        "the fence is kept for the next claim"
    );
    assert_eq!(
        (number(&stripped, "hd"), number(&stripped, "hu")),
        (day, until)
    );
    let bytes = size(&stripped);
    assert!(
        (150..200).contains(&bytes),
        "the memory of orders/o-1 once stripped: {bytes} bytes (+100 DynamoDB counts an item)"
    );
    assert_eq!(
        store.claim(&id, &p).await.expect("claim"),
        ClaimOutcome::Forgotten {
            expired_at: Timestamp::from_millis(day * DAY_MS)
        }
    );
}

#[tokio::test]
async fn a_client_that_does_not_remember_honours_a_memory_another_wrote() {
    let (store, plain, clock) = stores("mem-honoured").await;
    let scope = "payments";
    let (kept, unkept) = (
        RecordId::parse(scope, "by-remembering").expect("valid id"),
        RecordId::parse(scope, "by-plain").expect("valid id"),
    );
    let p = params(b"charge 10");
    let lease = acquire(&store, &kept, &p).await;
    store
        .fail(
            &lease,
            Failure::new(FailureClass::Terminal, "declined"),
            RETENTION,
        )
        .await
        .expect("fail");
    let lease = acquire(&plain, &unkept, &p).await;
    plain
        .complete(&lease, "ok".into(), RETENTION)
        .await
        .expect("complete");
    assert!(
        !common::item(&plain, &unkept)
            .await
            .expect("item")
            .contains_key("hu"),
        "a store that does not remember writes no memory"
    );
    clock.advance(RETENTION + DAY);
    purge_all(&plain).await;
    assert!(
        matches!(
            plain.claim(&kept, &p).await.expect("claim"),
            ClaimOutcome::Forgotten { .. }
        ),
        "the plain store's claim and purge keep the other's memory"
    );
    assert!(
        common::item(&plain, &unkept).await.is_none(),
        "purged whole"
    );
    assert!(matches!(
        store.claim(&unkept, &p).await.expect("claim"),
        ClaimOutcome::Acquired(_)
    ));
}

#[tokio::test]
async fn a_new_request_under_the_key_carries_the_memory_and_a_live_delete_forgets_it() {
    let (store, _, clock) = stores("mem-carried").await;
    let id = RecordId::parse("orders", "reused").expect("valid id");
    let (a, b) = (params(b"request A"), params(b"request B"));
    let lease = acquire(&store, &id, &a).await;
    store
        .complete(&lease, "A".into(), RETENTION)
        .await
        .expect("complete");
    clock.advance(RETENTION + Duration::from_secs(1));
    purge_all(&store).await;
    // B runs under the old key and is released: it never ends, so A's
    // memory is the item's still once B's record expires.
    let lease = acquire(&store, &id, &b).await;
    store
        .fail(
            &lease,
            Failure::new(FailureClass::Retryable, "later"),
            RETENTION,
        )
        .await
        .expect("release");
    clock.advance(RETENTION + Duration::from_secs(1));
    assert!(
        matches!(
            store.claim(&id, &a).await.expect("claim"),
            ClaimOutcome::Forgotten { .. }
        ),
        "A's late retry is refused after B's record expired"
    );
    let carried = common::item(&store, &id).await.expect("item");
    assert!(
        number(&carried, "sweep_at") < number(&carried, "hu") / 1000,
        "B's release set sweep_at by its own retention"
    );
    purge_all(&store).await;
    let stripped = common::item(&store, &id).await.expect("a tombstone");
    assert_eq!(
        number(&stripped, "sweep_at"),
        number(&stripped, "hu").div_ceil(1000),
        "the strip keeps the item for DynamoDB's TTL until A's memory ends"
    );
    acquire(&store, &id, &b).await;
    assert!(
        store.delete(&id).await.expect("delete"),
        "a live record is deleted"
    );
    let after = common::item(&store, &id).await.expect("a tombstone");
    assert!(
        !after.contains_key("hu"),
        "a live delete forgets the key's memory: {after:?}"
    );
    assert!(matches!(
        store.claim(&id, &a).await.expect("claim"),
        ClaimOutcome::Acquired(_)
    ));
}

#[tokio::test]
async fn the_purge_leaves_an_ended_memory_to_the_ttl_for_two_days() {
    let (store, _, clock) = stores("mem-ttl").await;
    let id = RecordId::parse("orders", "old").expect("valid id");
    let p = params(b"request");
    let lease = acquire(&store, &id, &p).await;
    store
        .complete(&lease, "ok".into(), RETENTION)
        .await
        .expect("complete");
    clock.advance(RETENTION + Duration::from_secs(1));
    purge_all(&store).await;
    let until = number(&common::item(&store, &id).await.expect("memory"), "hu");
    let to_end = until - clock.now().as_millis();
    clock.advance(Duration::from_millis(to_end) + DAY);
    purge_all(&store).await;
    assert!(
        common::item(&store, &id).await.is_some(),
        "a day after the memory ended, deleting it is still DynamoDB's TTL's"
    );
    assert!(matches!(
        store.claim(&id, &p).await.expect("claim"),
        ClaimOutcome::Acquired(_)
    ));
    let other = RecordId::parse("orders", "older").expect("valid id");
    let lease = acquire(&store, &other, &p).await;
    store
        .complete(&lease, "ok".into(), RETENTION)
        .await
        .expect("complete");
    let until = (clock.now().saturating_add(RETENTION).as_millis() / DAY_MS + 1) * DAY_MS
        + u64::try_from(MEMORY.as_millis()).expect("ms");
    clock.advance(Duration::from_millis(until - clock.now().as_millis()) + DAY * 2);
    purge_all(&store).await;
    assert!(
        common::item(&store, &other).await.is_none(),
        "two days after the memory ended, the purge deletes what TTL left"
    );
}

#[tokio::test]
async fn releasing_a_parked_record_forgets_the_memory_its_end_left() {
    let (store, _, clock) = stores("mem-resolved").await;
    let id = RecordId::parse("shipping", "parked").expect("valid id");
    let p = params(b"ship order 7");
    let lease = acquire(&store, &id, &p).await;
    store.begin_step(&lease, "ship").await.expect("begin");
    store
        .fail(
            &lease,
            Failure::new(FailureClass::Unknown, "step \"ship\" is in doubt"),
            RETENTION,
        )
        .await
        .expect("park");
    assert!(
        common::item(&store, &id)
            .await
            .expect("item")
            .contains_key("hu"),
        "a parked record ended, and is remembered"
    );
    assert_eq!(
        store
            .resolve_step(&id, "ship", Resolution::NotApplied)
            .await
            .expect("resolve"),
        Resolved::Released
    );
    assert!(
        !common::item(&store, &id)
            .await
            .expect("item")
            .contains_key("hu"),
        "released, it never ended"
    );
    clock.advance(RETENTION + Duration::from_secs(1));
    match store.claim(&id, &p).await.expect("claim") {
        ClaimOutcome::Acquired(_) => {}
        other => panic!("the retry of a released key runs, got {other:?}"),
    }
}
