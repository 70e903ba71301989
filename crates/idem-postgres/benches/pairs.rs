//! Claim+complete pairs per second through `PgStore`, next to the
//! server's own limit for the same work measured in the same run: `pgbench`
//! running the store's own claim and complete statements (prepared, as the
//! store runs them) with the same client count. One pgbench transaction is
//! one pair, so the ratio column is idem pairs/s over pgbench tps.
//!
//! Then batched claims (`claim_many`, 100 per call) against single claims
//! and against pgbench running the same batch statement, and replays through the cache tier (an in-process LRU, and Redis)
//! against replays answered by PostgreSQL alone.
//!
//! Run: `cargo bench -p idem-postgres --bench pairs [-- --secs N]`
//!
//! It starts its own PostgreSQL (initdb in a temporary directory, default
//! settings: fsync and synchronous_commit on) and its own redis-server on
//! free loopback ports, so nothing else competes for them.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

mod script;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::cache::{Cached, LruCache};
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{ClaimMany, RecordId, Store};
use idem_postgres::PgStore;
use idem_testkit::bench::{pair, rate, secs_arg};
use idem_testkit::servers::postgres::{pgbench_command, PgServer};
use idem_testkit::servers::redis::RedisServer;

const CONNECTIONS: [usize; 3] = [1, 8, 32];
const BATCH: usize = 100;
const HOT_KEYS: usize = 1000;

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

/// A pgbench script of one `claim_many` statement claiming `batch` fresh
/// keys, as the store sends it.
fn batch_script(store: &PgStore, batch: usize) -> String {
    let each = |expr: &str| format!("ARRAY(SELECT {expr} FROM generate_series(1, {batch}) g)");
    let mut script = String::from("\\set n random(1, 1000000000000)\n");
    script.push_str(&pgbench_command(
        store.claim_many_sql(),
        &[
            ("$1", &each("'bench'::text")),
            (
                "$2",
                &each("'b' || :client_id::text || '-' || :n::text || '-' || g"),
            ),
            ("$3", &each("NULL::bytea")),
            ("$4", &each("int8send(:n::bigint) || int8send(g::bigint)")),
            ("$5", &each("30000::float8")),
            ("$6", &each("3600000::float8")),
        ],
    ));
    script
}

/// pgbench running one claim and one complete per transaction: tps.
fn pgbench(server: &PgServer, store: &PgStore, clients: usize, secs: f64) -> f64 {
    server
        .pgbench(&script::run(store, 0), clients, secs)
        .expect("run pgbench")
}

async fn pairs(store: &PgStore, callers: usize, secs: f64) -> f64 {
    let s = store.clone();
    rate(callers, secs, move |c, i| {
        let s = s.clone();
        async move {
            let id = RecordId::parse("bench", &format!("p{c}-{i}")).expect("valid");
            pair(
                &s,
                &id,
                &params(),
                Bytes::from_static(b"{}"),
                Duration::from_secs(3600),
            )
            .await;
            1
        }
    })
    .await
}

/// Replays per second of `HOT_KEYS` completed keys through `store`.
async fn replays<S: Store + Clone>(store: &S, callers: usize, secs: f64) -> f64 {
    let s = store.clone();
    rate(callers, secs, move |c, i| {
        let s = s.clone();
        async move {
            let n = (c * 7919 + i as usize) % HOT_KEYS;
            let id = RecordId::parse("hot", &format!("h{n}")).expect("valid");
            match s.claim(&id, &params()).await.expect("replay") {
                ClaimOutcome::Completed(_) => 1,
                other => panic!("hot keys are completed, got {other:?}"),
            }
        }
    })
    .await
}

#[tokio::main]
async fn main() {
    let secs = secs_arg(3.0);
    let server = PgServer::start().expect("start postgres");
    let url = format!("{}?schema=bench", server.url("postgres"));
    let truncate = || {
        server
            .psql(
                "postgres",
                "TRUNCATE bench.idem_records, bench.idem_steps; CHECKPOINT",
            )
            .expect("truncate");
    };
    println!("# idem-postgres pairs, {secs} s per point\n");
    println!("| connections | idem pairs/s | pgbench pairs/s (same SQL) | ratio |");
    println!("|---:|---:|---:|---:|");
    let mut single_claims = 0.0;
    for connections in CONNECTIONS {
        let store = PgStore::builder(&url)
            .expect("url")
            .pool_size(connections)
            .connect()
            .await
            .expect("connect");
        truncate();
        let idem = pairs(&store, connections, secs).await;
        truncate();
        let ceiling = pgbench(&server, &store, connections, secs);
        println!(
            "| {connections} | {idem:.0} | {ceiling:.0} | {:.2} |",
            idem / ceiling
        );
        if connections == 8 {
            truncate();
            let s = store.clone();
            single_claims = rate(connections, secs, move |c, i| {
                let s = s.clone();
                async move {
                    let id = RecordId::parse("bench", &format!("c{c}-{i}")).expect("valid");
                    s.claim(&id, &params()).await.expect("claim");
                    1
                }
            })
            .await;
        }
    }

    let store = PgStore::builder(&url)
        .expect("url")
        .pool_size(8)
        .connect()
        .await
        .expect("connect");
    truncate();
    let s = store.clone();
    let batched = rate(8, secs, move |c, i| {
        let s = s.clone();
        async move {
            let claims: Vec<(RecordId, ClaimParams)> = (0..BATCH)
                .map(|j| {
                    let id = RecordId::parse("bench", &format!("b{c}-{i}-{j}")).expect("valid");
                    (id, params())
                })
                .collect();
            let results = s.claim_many(&claims).await.expect("batch");
            results.iter().filter(|r| r.is_ok()).count() as u64
        }
    })
    .await;
    truncate();
    let pgbench_batched = server
        .pgbench(&batch_script(&store, BATCH), 8, secs)
        .expect("run pgbench")
        * BATCH as f64;
    println!(
        "\n| connections | single claims/s | claim_many({BATCH}) claims/s | batched/single | pgbench claims/s (same SQL) | batched/pgbench |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| 8 | {single_claims:.0} | {batched:.0} | {:.1} | {pgbench_batched:.0} | {:.2} |",
        batched / single_claims,
        batched / pgbench_batched
    );

    truncate();
    for n in 0..HOT_KEYS {
        let id = RecordId::parse("hot", &format!("h{n}")).expect("valid");
        let response = Bytes::from_static(b"{\"ok\":true}");
        pair(&store, &id, &params(), response, Duration::from_secs(3600)).await;
    }
    let redis = RedisServer::start().expect("start redis-server");
    let redis_cache = idem_redis::RedisStore::connect(&redis.url())
        .await
        .expect("connect redis")
        .replay_cache();
    let alone = replays(&store, 8, secs).await;
    let lru = replays(
        &Arc::new(Cached::new(store.clone(), LruCache::new(10_000))),
        8,
        secs,
    )
    .await;
    let via_redis = replays(&Arc::new(Cached::new(store.clone(), redis_cache)), 8, secs).await;
    println!("\n| 8 callers, {HOT_KEYS} hot keys | replays/s | vs PostgreSQL alone |");
    println!("|---|---:|---:|");
    println!("| PostgreSQL alone | {alone:.0} | 1.0 |");
    println!(
        "| cache tier, in-process LRU | {lru:.0} | {:.1} |",
        lru / alone
    );
    println!(
        "| cache tier, Redis | {via_redis:.0} | {:.1} |",
        via_redis / alone
    );
}
