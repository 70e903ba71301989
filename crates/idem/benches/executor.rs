//! What the executor adds to a run, next to the store's own work in the
//! same run: on `MemoryStore`, one task on a current-thread runtime runs
//! fresh keys one after another, as `Idempotency::run` with a handler that
//! returns at once, and as the bare `claim` + `complete` of the same keys
//! with the response already encoded. The difference is the executor's
//! path per run: its span, metrics, lease upkeep, encoding and replay
//! cache. Duplicates are measured the same way: `run` of a completed key
//! (answered from the replay cache) beside the store's `claim` of it.
//!
//! Run: `cargo bench -p idem-core --bench executor`
//! (`IDEM_BENCH_RUNS` sets the runs per round, default 200,000; 3 rounds).
//! Under callgrind, one round of few runs shows where the time goes:
//! `IDEM_BENCH_RUNS=20000 IDEM_BENCH_ROUNDS=1 valgrind --tool=callgrind
//! target/release/deps/executor-*`.

#![allow(clippy::print_stdout, missing_docs)]

use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Idempotency, MemoryStore, Outcome, RecordId, Store};
use idem_testkit::bench::pair;

const RESPONSE: &[u8] = br#"{"status":201,"charge":"ch_123"}"#;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn ids(round: usize, what: &str, n: usize) -> Vec<RecordId> {
    (0..n)
        .map(|i| {
            RecordId::parse("bench", &format!("order-{round}-{what}-{i:08}:charge:v1"))
                .expect("valid")
        })
        .collect()
}

/// Nanoseconds per item of `work` over `items`.
async fn per_item<F, Fut>(items: &[RecordId], mut work: F) -> f64
where
    F: FnMut(RecordId) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = Instant::now();
    for id in items {
        work(id.clone()).await;
    }
    start.elapsed().as_nanos() as f64 / items.len() as f64
}

/// `run` of `id` with a handler that returns `value` at once.
async fn run_once(idem: &Idempotency<MemoryStore>, id: &RecordId, value: u16) -> Outcome<u16> {
    idem.run(id, None, |_| async move { Ok::<_, Infallible>(value) })
        .await
        .expect("run")
}

async fn round(round: usize, n: usize) -> [f64; 4] {
    let store = MemoryStore::new();
    let idem = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let params = ClaimParams::new(Duration::from_secs(60), Duration::from_secs(3600));
    let (bare_ids, run_ids) = (ids(round, "bare", n), ids(round, "run", n));

    let bare = per_item(&bare_ids, |id| {
        let (store, params) = (&store, &params);
        async move {
            pair(
                store,
                &id,
                params,
                Bytes::from_static(RESPONSE),
                Duration::from_secs(3600),
            )
            .await;
        }
    })
    .await;

    let run = per_item(&run_ids, |id| {
        let idem = &idem;
        async move {
            let outcome = run_once(idem, &id, 201).await;
            assert!(matches!(outcome, Outcome::Executed { .. }));
        }
    })
    .await;

    let bare_replay = per_item(&bare_ids, |id| {
        let (store, params) = (&store, &params);
        async move {
            let outcome = store.claim(&id, params).await.expect("claim");
            assert!(matches!(outcome, ClaimOutcome::Completed(_)));
        }
    })
    .await;

    let replay = per_item(&run_ids, |id| {
        let idem = &idem;
        async move {
            let outcome = run_once(idem, &id, 0).await;
            assert!(matches!(outcome, Outcome::Replayed { value: 201 }));
        }
    })
    .await;
    [bare, run, bare_replay, replay]
}

fn main() {
    let n = env("IDEM_BENCH_RUNS", 200_000);
    let rounds = env("IDEM_BENCH_ROUNDS", 3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("# Executor per run on MemoryStore, {n} runs per round, one task\n");
    println!(
        "| round | store claim+complete ns | run ns | run / store \
         | store claim of a completed key ns | replay ns | replay / store |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in 0..rounds {
        let [bare, run, bare_replay, replay] = rt.block_on(round(r, n));
        println!(
            "| {r} | {bare:.0} | {run:.0} | {:.2} | {bare_replay:.0} | {replay:.0} | {:.2} |",
            run / bare,
            replay / bare_replay
        );
    }
}
