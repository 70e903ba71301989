//! Claim + complete pairs per second through `SqliteStore` (group commit)
//! at 1, 16 and 64 concurrent callers, next to plain SQLite at the same
//! durability (WAL, same `synchronous`), in the same run, on the same disk:
//!
//! - "plain, 1 txn": `INSERT OR IGNORE` + `UPDATE` in one transaction per
//!   pair;
//! - "plain, 2 txns": the same two statements each in its own
//!   transaction, which is the equivalent work (a claim must be committed
//!   before the handler runs, so that duplicates see it; the completion is
//!   a second commit).
//! - "plain, batched": the best any group commit could do with 64 callers
//!   on this machine: every transaction carries the claims of 64 fresh
//!   keys and the completions of the 64 keys claimed in the transaction
//!   before, so each commit serves 64 pairs. No channels, no state
//!   machine, no reads: the ceiling of the SQL work itself.
//!
//! Run: `cargo bench -p idem-sqlite --bench group_commit`
//! (`IDEM_BENCH_SECS`: seconds per row, default 3; `IDEM_BENCH_WORKERS`:
//! tokio worker threads, default 2).

#![allow(clippy::print_stdout, missing_docs)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::{ClaimOutcome, ClaimParams, RecordId, Store};
use idem_sqlite::{Durability, SqliteStore};
use rusqlite::{params, Connection};

const RESPONSE: &[u8] = br#"{"status":201,"charge":"ch_123"}"#;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Plain SQLite pairs per second; `split` commits the claim on its own.
fn plain(dir: &Path, durability: Durability, split: bool, run: Duration) -> f64 {
    let conn = plain_table(dir, &format!("plain-{durability:?}-{split}"), durability);
    let start = Instant::now();
    let mut pairs = 0u64;
    while start.elapsed() < run {
        let key = plain_key(pairs);
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        conn.prepare_cached(INSERT)
            .and_then(|mut s| s.execute(params![key]))
            .expect("insert");
        if split {
            conn.execute_batch("COMMIT; BEGIN IMMEDIATE")
                .expect("commit the claim");
        }
        conn.prepare_cached(UPDATE)
            .and_then(|mut s| s.execute(params![key, RESPONSE]))
            .expect("update");
        conn.execute_batch("COMMIT").expect("commit");
        pairs += 1;
    }
    pairs as f64 / start.elapsed().as_secs_f64()
}

const INSERT: &str = "INSERT OR IGNORE INTO records (scope, key, state) VALUES ('bench', ?1, 0)";
const UPDATE: &str =
    "UPDATE records SET state = 1, response = ?2 WHERE scope = 'bench' AND key = ?1";

fn plain_key(n: u64) -> String {
    format!("order-{n}:charge:v1")
}

/// A fresh WAL database with the plain baseline's table.
fn plain_table(dir: &Path, name: &str, durability: Durability) -> Connection {
    let conn = Connection::open(dir.join(format!("{name}.db"))).expect("open");
    let sync = if durability == Durability::Full {
        "FULL"
    } else {
        "NORMAL"
    };
    conn.execute_batch(&format!(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync};
         CREATE TABLE records (scope TEXT NOT NULL, key TEXT NOT NULL, state INTEGER NOT NULL,
                               response BLOB, PRIMARY KEY (scope, key));"
    ))
    .expect("schema");
    conn
}

/// Plain SQLite with perfect batching: each transaction claims `width`
/// fresh keys and completes the previous transaction's `width` keys.
fn batched(dir: &Path, durability: Durability, width: u64, run: Duration) -> f64 {
    let conn = plain_table(dir, &format!("batched-{durability:?}"), durability);
    let start = Instant::now();
    let mut next = 0u64;
    while start.elapsed() < run {
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        for key in next..next + width {
            conn.prepare_cached(INSERT)
                .and_then(|mut s| s.execute(params![plain_key(key)]))
                .expect("insert");
        }
        for key in next.saturating_sub(width)..next {
            conn.prepare_cached(UPDATE)
                .and_then(|mut s| s.execute(params![plain_key(key), RESPONSE]))
                .expect("update");
        }
        conn.execute_batch("COMMIT").expect("commit");
        next += width;
    }
    // The last batch's claims were never completed.
    next.saturating_sub(width) as f64 / start.elapsed().as_secs_f64()
}

async fn idem_store(store: SqliteStore, callers: usize, run: Duration) -> f64 {
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let pairs = Arc::new(AtomicU64::new(0));
    let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (store, stop, pairs, params) = (
                Arc::clone(&store),
                Arc::clone(&stop),
                Arc::clone(&pairs),
                params.clone(),
            );
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let id = RecordId::parse("bench", &format!("order-{c}-{i}:charge:v1"))
                        .expect("valid");
                    let ClaimOutcome::Acquired(lease) =
                        store.claim(&id, &params).await.expect("claim")
                    else {
                        panic!("fresh keys are acquired");
                    };
                    store
                        .complete(
                            &lease,
                            Bytes::from_static(RESPONSE),
                            Duration::from_secs(3600),
                        )
                        .await
                        .expect("complete");
                    pairs.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller");
    }
    pairs.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let run = Duration::from_secs_f64(env("IDEM_BENCH_SECS", 3.0));
    let workers = env("IDEM_BENCH_WORKERS", 2usize);
    let dir =
        tempfile::tempdir_in(env("CARGO_TARGET_TMPDIR", std::env::temp_dir())).expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "{:.1} s per row, {workers} tokio workers; files in {}\n",
        run.as_secs_f64(),
        dir.path().display()
    );
    println!("| callers | durability | plain, 1 txn | plain, 2 txns | plain, batched | SqliteStore | store / 1 txn | store / 2 txns | store / batched |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for durability in [Durability::Full, Durability::Normal] {
        let one = plain(dir.path(), durability, false, run);
        let two = plain(dir.path(), durability, true, run);
        let ceiling = batched(dir.path(), durability, 64, run);
        for callers in [1, 16, 64] {
            let path = dir.path().join(format!("idem-{callers}-{durability:?}.db"));
            let store = SqliteStore::builder(&path)
                .durability(durability)
                .open()
                .expect("open");
            let rate = rt.block_on(idem_store(store, callers, run));
            println!(
                "| {callers} | {durability:?} | {one:.0} | {two:.0} | {ceiling:.0} | {rate:.0} | {:.2} | {:.2} | {:.2} |",
                rate / one,
                rate / two,
                rate / ceiling
            );
        }
    }
}
