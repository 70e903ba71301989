//! The cache tier over the in-memory store on a manual clock: it passes
//! the whole conformance suite (the cache never changes an answer), serves
//! replays without the system of record, and never serves a record past
//! its expiry, an in-progress one, or one deleted through it.

use std::time::Duration;

use bytes::Bytes;
use idem::cache::{Cached, LruCache, ReplayCache};
use idem::{
    ClaimOutcome, ClaimParams, DeleteRecord, Fingerprint, ManualClock, MemoryStore, RecordId, Store,
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
