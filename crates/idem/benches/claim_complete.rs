//! Claim + complete pairs per second on `MemoryStore`, next to a bare
//! concurrent hash map (DashMap) doing the equivalent raw work in the same
//! run: insert-if-absent of the record, then an update of it with the
//! response. Each pair uses a fresh key, as first deliveries do.
//!
//! Run: `cargo bench -p idem-core --bench claim_complete`
//! (`IDEM_BENCH_PAIRS` sets the pairs per thread, default 1,000,000).

#![allow(clippy::print_stdout, missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{MemoryStore, RecordId, Scope, Store};

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// The memory store's futures are ready at once; poll them without a
/// runtime so the benchmark measures the store, not a scheduler.
fn ready<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("MemoryStore futures complete without waiting"),
    }
}

/// What the bare map stores per key: written, never read back, as in the
/// store's claim+complete path.
#[allow(dead_code)]
struct BareRecord {
    state: u8,
    token: u64,
    expires_at: u64,
    response: Bytes,
}

fn keys(threads: usize, per_thread: usize, round: &str) -> Vec<Vec<RecordId>> {
    let scope = Scope::new("bench").expect("valid scope");
    (0..threads)
        .map(|t| {
            (0..per_thread)
                .map(|i| {
                    let key = idem::Key::new(&format!("order-{round}-{t}-{i:08}:charge:v1"))
                        .expect("valid key");
                    RecordId::new(scope.clone(), key)
                })
                .collect()
        })
        .collect()
}

fn timed(threads: usize, work: impl Fn(usize) + Sync) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, work) = (&barrier, &work);
            s.spawn(move || {
                barrier.wait();
                work(t);
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed()
    })
}

fn bare_map(ids: &[Vec<RecordId>], response: &Bytes) -> Duration {
    let map: DashMap<RecordId, BareRecord> = DashMap::new();
    let elapsed = timed(ids.len(), |t| {
        for (i, id) in ids[t].iter().enumerate() {
            map.entry(id.clone()).or_insert_with(|| BareRecord {
                state: 0,
                token: i as u64,
                expires_at: 0,
                response: Bytes::new(),
            });
            if let Some(mut r) = map.get_mut(id) {
                r.state = 1;
                r.expires_at = black_box(1);
                r.response = response.clone();
            }
        }
    });
    assert_eq!(map.len(), ids.iter().map(Vec::len).sum::<usize>());
    elapsed
}

fn memory_store(ids: &[Vec<RecordId>], response: &Bytes) -> Duration {
    let store = MemoryStore::builder().max_records(usize::MAX / 2).build();
    let params = ClaimParams::new(LEASE, RETENTION);
    let elapsed = timed(ids.len(), |t| {
        for id in &ids[t] {
            let ClaimOutcome::Acquired(lease) = ready(store.claim(id, &params)).expect("claim")
            else {
                panic!("fresh keys are acquired");
            };
            ready(store.complete(&lease, response.clone(), RETENTION)).expect("complete");
        }
    });
    assert_eq!(store.len(), ids.iter().map(Vec::len).sum::<usize>());
    elapsed
}

fn main() {
    let per_thread: usize = std::env::var("IDEM_BENCH_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let response = Bytes::from_static(br#"{"status":201,"charge":"ch_123"}"#);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!(
        "cpu: {cpu}; available parallelism: {:?}",
        std::thread::available_parallelism().map(|n| n.get())
    );
    println!("{per_thread} claim+complete pairs per thread, fresh keys, best of 3 rounds\n");
    println!("| threads | bare DashMap pairs/s | MemoryStore pairs/s | store / bare |");
    println!("|---:|---:|---:|---:|");
    for threads in [1, 2] {
        let mut best_bare = Duration::MAX;
        let mut best_store = Duration::MAX;
        for round in 0..3 {
            let ids = keys(threads, per_thread, &format!("b{round}"));
            best_bare = best_bare.min(bare_map(&ids, &response));
            let ids = keys(threads, per_thread, &format!("s{round}"));
            best_store = best_store.min(memory_store(&ids, &response));
        }
        let total = (threads * per_thread) as f64;
        let bare = total / best_bare.as_secs_f64();
        let store = total / best_store.as_secs_f64();
        println!(
            "| {threads} | {bare:.0} | {store:.0} | {:.2} |",
            store / bare
        );
    }
}
