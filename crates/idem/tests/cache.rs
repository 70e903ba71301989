//! The cache tier over the in-memory store on a manual clock: it passes
//! the whole conformance suite (the cache never changes an answer), serves
//! replays without the system of record, and never serves a record past
//! its expiry, an in-progress one, or one deleted through it.

use std::time::Duration;

use bytes::Bytes;
use idem::cache::{Cached, LruCache, ReplayCache};
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{
    DeleteRecord, Failure, Fingerprint, ManualClock, MemoryStore, RecordId, RecordTtl, Store,
    StoreError, Timestamp,
};
use idem_testkit::Fixture;

type Tier = Cached<MemoryStore<ManualClock>, LruCache<ManualClock>>;

fn tier(clock: &ManualClock) -> (Tier, MemoryStore<ManualClock>) {
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let cache = LruCache::with_clock(1000, clock.clone());
    (Cached::new(store.clone(), cache), store)
}

mod conformance {
    use super::*;

    async fn fixture(case: &'static str) -> Fixture<Tier> {
        let clock = ManualClock::default();
        Fixture::manual(tier(&clock).0, clock, case)
    }

    idem_testkit::conformance_suite!(fixture);
}

const LEASE: Duration = Duration::from_secs(10);
const KEEP: Duration = Duration::from_secs(100);

async fn complete(store: &Tier, id: &RecordId, p: &ClaimParams, body: &'static [u8]) {
    let ClaimOutcome::Acquired(lease) = store.claim(id, p).await.expect("claim") else {
        panic!("expected to acquire {id}");
    };
    assert!(store.cache().is_empty() || store.cache().get(id).await.expect("get").is_none());
    store
        .complete(&lease, Bytes::from_static(body), KEEP)
        .await
        .expect("complete");
}

#[tokio::test]
async fn replays_come_from_the_cache_once_filled() {
    let clock = ManualClock::default();
    let (tier, store) = tier(&clock);
    let id = RecordId::parse("s", "k1").expect("id");
    let p = ClaimParams::new(LEASE, KEEP);
    complete(&tier, &id, &p, b"paid").await;
    assert!(
        tier.cache().is_empty(),
        "completing does not fill the cache"
    );
    // The first replay comes from the store and fills the cache.
    assert_eq!(
        tier.claim(&id, &p).await.expect("replay"),
        ClaimOutcome::Completed(Bytes::from_static(b"paid"))
    );
    assert_eq!(tier.cache().len(), 1);
    // Remove the record behind the cache's back: the replay still comes,
    // so it was served by the cache and not by the store.
    assert!(store.delete(&id).await.expect("delete"));
    assert_eq!(
        tier.claim(&id, &p).await.expect("cached"),
        ClaimOutcome::Completed(Bytes::from_static(b"paid"))
    );
    // A different fingerprint is not served from the cache.
    let other = p.clone().fingerprint(Fingerprint::of_bytes(b"other"));
    assert!(matches!(
        tier.claim(&id, &other).await.expect("claim"),
        ClaimOutcome::Acquired(_)
    ));
}

#[tokio::test]
async fn an_expired_record_is_never_served() {
    let clock = ManualClock::default();
    let (tier, _) = tier(&clock);
    let id = RecordId::parse("s", "k2").expect("id");
    let p = ClaimParams::new(LEASE, KEEP);
    complete(&tier, &id, &p, b"paid").await;
    clock.advance(KEEP - Duration::from_millis(150));
    tier.claim(&id, &p).await.expect("replay fills the cache");
    // 150 ms were left; less the 100 ms margin, the entry lives 50 ms.
    clock.advance(Duration::from_millis(60));
    assert_eq!(
        tier.cache().get(&id).await.expect("get"),
        None,
        "the entry ended before the record"
    );
    clock.advance(Duration::from_millis(100));
    assert!(
        matches!(
            tier.claim(&id, &p).await.expect("claim"),
            ClaimOutcome::Acquired(_)
        ),
        "past its retention the record is absent, cache or not"
    );
}

/// The memory store, with another process deleting a record and claiming
/// it again (a new run) just before the cache asks how long it has left.
struct DeletedDuringFill(MemoryStore<ManualClock>);

impl Store for DeletedDuringFill {
    async fn claim(&self, id: &RecordId, p: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(id, p).await
    }
    async fn complete(&self, l: &Lease, r: Bytes, keep: Duration) -> Result<(), StoreError> {
        self.0.complete(l, r, keep).await
    }
    async fn fail(&self, l: &Lease, f: Failure, keep: Duration) -> Result<(), StoreError> {
        self.0.fail(l, f, keep).await
    }
    async fn extend(&self, l: &Lease, d: Duration) -> Result<Timestamp, StoreError> {
        self.0.extend(l, d).await
    }
    async fn release(&self, l: &Lease) -> Result<(), StoreError> {
        self.0.release(l).await
    }
}

impl RecordTtl for DeletedDuringFill {
    async fn ttl(&self, id: &RecordId, response: &[u8]) -> Result<Option<Duration>, StoreError> {
        self.0.delete(id).await?;
        self.0.claim(id, &ClaimParams::new(LEASE, KEEP)).await?;
        self.0.ttl(id, response).await
    }
}

/// The cache asks for the time left of the completion it read, not of
/// whatever the key holds by then: a record deleted and claimed again in
/// between is not cached, so the new run's duplicates are not answered
/// with the old response (issue 26, item 6).
#[tokio::test]
async fn a_record_deleted_and_claimed_again_during_the_fill_is_not_cached() {
    let clock = ManualClock::default();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let tier = Cached::new(
        DeletedDuringFill(store.clone()),
        LruCache::with_clock(1000, clock.clone()),
    );
    let id = RecordId::parse("s", "k5").expect("id");
    let p = ClaimParams::new(LEASE, KEEP);
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &p).await.expect("claim") else {
        panic!("acquire");
    };
    store
        .complete(&lease, Bytes::from_static(b"old"), KEEP)
        .await
        .expect("complete");
    assert_eq!(
        tier.claim(&id, &p).await.expect("claim"),
        ClaimOutcome::Completed(Bytes::from_static(b"old")),
        "read before the delete"
    );
    assert!(tier.cache().is_empty(), "the old response was cached");
    assert!(
        matches!(
            tier.claim(&id, &p).await.expect("claim"),
            ClaimOutcome::InProgress { .. }
        ),
        "the new run is in progress"
    );
}

#[tokio::test]
async fn in_progress_and_deleted_records_are_not_served() {
    let clock = ManualClock::default();
    let (tier, _) = tier(&clock);
    let id = RecordId::parse("s", "k3").expect("id");
    let p = ClaimParams::new(LEASE, KEEP);
    let ClaimOutcome::Acquired(lease) = tier.claim(&id, &p).await.expect("claim") else {
        panic!("acquire");
    };
    assert!(matches!(
        tier.claim(&id, &p).await.expect("claim"),
        ClaimOutcome::InProgress { .. }
    ));
    assert!(tier.cache().is_empty(), "nothing in progress is cached");
    tier.release(&lease).await.expect("release");
    assert!(matches!(
        tier.claim(&id, &p).await.expect("claim"),
        ClaimOutcome::Acquired(_)
    ));
    assert!(tier.cache().is_empty(), "a released record is not cached");

    let id = RecordId::parse("s", "k4").expect("id");
    complete(&tier, &id, &p, b"done").await;
    tier.claim(&id, &p).await.expect("fill");
    assert_eq!(tier.cache().len(), 1);
    assert!(tier.delete(&id).await.expect("delete"));
    assert!(
        tier.cache().is_empty(),
        "a delete through the tier clears the cache"
    );
    assert!(matches!(
        tier.claim(&id, &p).await.expect("claim"),
        ClaimOutcome::Acquired(_)
    ));
}
