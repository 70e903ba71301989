//! File size of a store taking 1,000,000 fresh keys with a short retention
//! while the background purge runs: it must level off, not grow with the
//! number of keys.
//!
//! Time is a manual clock advanced 1 ms per completed pair, and records are
//! kept 10 s, so about 10,000 records are live at any moment; the purger
//! runs every 50 ms (real time) in batches of 2,000.
//!
//! With `IDEM_BENCH_REMEMBER=30d` the store remembers expired keys
//! ([`idem::horizon`]): the file then grows by what it remembers, and the
//! last line says how many bytes a remembered key costs, against the same
//! run without (run both: the anchor is the run without).
//!
//! Run: `cargo bench -p idem-sqlite --bench file_growth`
//! (`IDEM_BENCH_KEYS` sets the number of keys, default 1,000,000).

#![allow(clippy::print_stdout, missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::store::ClaimParams;
use idem::{ManualClock, RecordId};
use idem_sqlite::SqliteStore;
use idem_testkit::bench::pair;

const RETENTION: Duration = Duration::from_secs(10);
const CALLERS: u64 = 64;
const REPORT_EVERY: u64 = 100_000;

fn size(path: &std::path::Path) -> f64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) as f64 / (1024.0 * 1024.0)
}

fn main() {
    let keys: u64 = std::env::var("IDEM_BENCH_KEYS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let base = std::env::var("CARGO_TARGET_TMPDIR")
        .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let path = dir.path().join("growth.db");
    let wal = dir.path().join("growth.db-wal");
    let remember = std::env::var("IDEM_BENCH_REMEMBER")
        .ok()
        .map(|s| idem::url::parse_duration(&s).expect("IDEM_BENCH_REMEMBER: a duration"));
    let clock = ManualClock::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "{keys} keys, retention {RETENTION:?} of manual time, 1 ms per pair, {CALLERS} \
         callers, expired keys remembered: {remember:?}\n"
    );
    println!("| keys done | db MiB | wal MiB | rows in file | keys remembered | elapsed |");
    println!("|---:|---:|---:|---:|---:|---:|");
    rt.block_on(async {
        let mut builder = SqliteStore::builder(&path).clock(clock.clone());
        if let Some(memory) = remember {
            builder = builder.remember_expired(memory);
        }
        let store = Arc::new(builder.open().expect("open"));
        let _purger = store.spawn_purger(Duration::from_millis(50), 2_000);
        let next = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let params = ClaimParams::new(Duration::from_secs(5), RETENTION);
        let tasks: Vec<_> = (0..CALLERS)
            .map(|_| {
                let (store, next, done, clock, params) = (
                    Arc::clone(&store),
                    Arc::clone(&next),
                    Arc::clone(&done),
                    clock.clone(),
                    params.clone(),
                );
                let (path, wal) = (path.clone(), wal.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= keys {
                            break;
                        }
                        let id = RecordId::parse("growth", &format!("msg-{i}")).expect("valid");
                        pair(
                            &store,
                            &id,
                            &params,
                            Bytes::from_static(&[7u8; 200]),
                            RETENTION,
                        )
                        .await;
                        clock.advance(Duration::from_millis(1));
                        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if n % REPORT_EVERY == 0 {
                            let rows: i64 = rusqlite::Connection::open(&path)
                                .and_then(|c| {
                                    c.query_row("SELECT count(*) FROM idem_records", [], |r| {
                                        r.get(0)
                                    })
                                })
                                .expect("count");
                            let remembered = store.remembered().await.expect("remembered");
                            println!(
                                "| {n} | {:.1} | {:.1} | {rows} | {remembered} | {:.1} s |",
                                size(&path),
                                size(&wal),
                                started.elapsed().as_secs_f64()
                            );
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("caller");
        }
        let remembered = store.remembered().await.expect("remembered");
        if remembered > 0 {
            println!(
                "\n{remembered} keys remembered; file {:.1} MiB: {:.0} bytes of file per \
                 remembered key above the run without (subtract that run's size)",
                size(&path),
                size(&path) * 1024.0 * 1024.0 / remembered as f64
            );
        }
    });
}
