//! The cache tier with PostgreSQL as the system of record: the whole
//! conformance suite through an in-process LRU and through Redis (the
//! cache never changes an answer), and replays served from Redis without
//! PostgreSQL but never past the record's expiry.

mod common;

use std::time::Duration;

use bytes::Bytes;
use idem::cache::{Cached, LruCache, ReplayCache};
use idem::store::{ClaimOutcome, ClaimParams};
use idem::Store;
use idem_postgres::PgStore;
use idem_redis::{RedisReplayCache, RedisStore};
use idem_testkit::servers::redis::RedisServer;
use idem_testkit::Fixture;

fn redis() -> &'static RedisServer {
    RedisServer::shared().expect("redis-server")
}

async fn redis_cache() -> RedisReplayCache {
    RedisStore::builder(&redis().url())
        .expect("url")
        .namespace(format!("tier-{:016x}", rand::random::<u64>()))
        .connect()
        .await
        .expect("connect redis")
        .replay_cache()
}

mod lru {
    use super::*;

    async fn fixture(case: &'static str) -> Fixture<Cached<PgStore, LruCache>> {
        let store = common::store("lru").await;
        Fixture::real_time(Cached::new(store, LruCache::new(10_000)), case)
    }

    idem_testkit::conformance_suite!(fixture);
}

mod redis_cache {
    use super::*;

    async fn fixture(case: &'static str) -> Fixture<Cached<PgStore, RedisReplayCache>> {
        let store = common::store("rcache").await;
        Fixture::real_time(Cached::new(store, redis_cache().await), case)
    }

    idem_testkit::conformance_suite!(fixture);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_are_served_from_redis_and_never_past_expiry() {
    let store = common::store("served").await;
    let tier = Cached::new(store.clone(), redis_cache().await);
    let id = idem::RecordId::parse("orders", "o-1").expect("id");
    let keep = Duration::from_millis(1500);
    let p = ClaimParams::new(Duration::from_millis(500), keep);
    let ClaimOutcome::Acquired(lease) = tier.claim(&id, &p).await.expect("claim") else {
        panic!("acquire");
    };
    assert_eq!(
        tier.cache().get(&id).await.expect("get"),
        None,
        "in progress: not cached"
    );
    tier.complete(&lease, Bytes::from_static(b"shipped"), keep)
        .await
        .expect("complete");
    let replay = ClaimOutcome::Completed(Bytes::from_static(b"shipped"));
    assert_eq!(tier.claim(&id, &p).await.expect("fills"), replay);
    assert!(tier.cache().get(&id).await.expect("get").is_some());

    // Take the record's response away in PostgreSQL itself: a replay that
    // still says "shipped" can only have come from Redis.
    let (server, db) = common::server();
    server
        .psql(
            db,
            &format!(
                "UPDATE {}.idem_records SET response = 'changed' WHERE key = 'o-1'",
                store.schema()
            ),
        )
        .expect("psql");
    assert_eq!(tier.claim(&id, &p).await.expect("cached"), replay);

    tokio::time::sleep(keep + Duration::from_millis(100)).await;
    assert!(
        matches!(
            tier.claim(&id, &p).await.expect("claim"),
            ClaimOutcome::Acquired(_)
        ),
        "past its retention the record is claimable again, and the cache does not say otherwise"
    );
}
