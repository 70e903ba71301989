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
//! - "store's tables, batched": the same, on the store's own table and
//!   indexes with the statements the store makes (a full record inserted,
//!   then updated to completed), so the ratio to it is what the store's
//!   machinery costs beyond its SQL.
//! - "its tables at the callers' width": the same again, but each
//!   transaction carries only what the row's callers can offer at once.
//!   A caller has one job in flight (its claim must be answered before it
//!   completes), so a commit can serve at most one job a caller: here half
//!   the callers' claims and the other half's completions. The batched
//!   rows above carry twice that at 64 callers, which no store serving 64
//!   callers one job at a time can. (A lone caller's jobs take a commit
//!   each: "plain, 2 txns" is its row.)
//!
//! Each row runs twice, once per key pattern, in the batched baselines
//! and the store alike: the callers' own keys (`order-<caller>-<n>`, so
//! each commit writes at 64 places of the key index) and one rising
//! sequence (each commit appends at the end of the index). The pattern
//! decides the ceiling by 3x on this disk, so a ratio only holds between
//! runs with the same keys.
//!
//! Run: `cargo bench -p idem-sqlite --bench group_commit`
//! (`IDEM_BENCH_SECS`: seconds per row, default 3; `IDEM_BENCH_WORKERS`:
//! tokio worker threads, default 2; `IDEM_BENCH_CALLERS`: the store's rows,
//! default `1,16,64`; `IDEM_BENCH_DURABILITY`: `full`, `normal` or both,
//! the default; to profile one row, say `IDEM_BENCH_CALLERS=64
//! IDEM_BENCH_DURABILITY=full`).

#![allow(clippy::print_stdout, missing_docs)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::store::ClaimParams;
use idem::RecordId;
use idem_sqlite::{Durability, SqliteStore};
use idem_testkit::bench::pair;
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

/// Which keys the batched baseline writes.
#[derive(Clone, Copy, Debug)]
enum Keys {
    /// One rising sequence: each batch appends to the end of the index.
    Sequential,
    /// The callers' keys, `order-<caller>-<n>`: each batch writes one key
    /// at each caller's place in the index, as the store's callers do.
    Callers,
}

/// The SQL a batched baseline runs: on which table, with which statements.
#[derive(Clone, Copy, Debug)]
enum Tables {
    /// The plain table: a key and a state.
    Plain,
    /// The store's own table and indexes, written with the statements the
    /// store makes (a full record inserted, then updated to completed).
    Store,
}

const INSERT_RECORD: &str = "INSERT INTO idem_records (state, token, lease_until, response, \
     failure_class, failure_msg, fingerprint, attempt, fence, created_at, updated_at, expires_at, \
     scope, key) VALUES (0, ?2, ?3, NULL, NULL, NULL, NULL, 1, ?4, ?5, ?5, ?6, 'bench', ?1) \
     ON CONFLICT (scope, key) DO NOTHING";
const UPDATE_RECORD: &str = "UPDATE idem_records SET state = 1, token = NULL, lease_until = NULL, \
     response = ?2, updated_at = ?3, expires_at = ?4 WHERE scope = 'bench' AND key = ?1";

/// A connection to a fresh file holding `tables`, at `durability`.
fn baseline_file(dir: &Path, name: &str, tables: Tables, durability: Durability) -> Connection {
    match tables {
        Tables::Plain => plain_table(dir, name, durability),
        Tables::Store => {
            let path = dir.join(format!("{name}.db"));
            drop(
                SqliteStore::builder(&path)
                    .durability(durability)
                    .open()
                    .expect("schema"),
            );
            let conn = Connection::open(&path).expect("open");
            let sync = if durability == Durability::Full {
                "FULL"
            } else {
                "NORMAL"
            };
            conn.execute_batch(&format!("PRAGMA synchronous = {sync}"))
                .expect("pragma");
            conn
        }
    }
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(since.as_millis()).expect("fits")
}

/// Plain SQLite with perfect batching: each transaction claims `width`
/// fresh keys and completes the previous transaction's `width` keys; with
/// [`Keys::Callers`], the keys of `places` callers in turn.
fn batched(
    dir: &Path,
    durability: Durability,
    (width, places): (u64, u64),
    (keys, tables): (Keys, Tables),
    run: Duration,
) -> f64 {
    let name = format!("batched-{durability:?}-{keys:?}-{tables:?}-{width}-{places}");
    let conn = baseline_file(dir, &name, tables, durability);
    let key = |batch: u64, slot: u64| {
        let n = batch * width + slot;
        match keys {
            Keys::Sequential => plain_key(n),
            Keys::Callers => format!("order-{}-{}:charge:v1", n % places, n / places),
        }
    };
    let claim = |key: String, fence: u64| {
        let now = now_ms();
        match tables {
            Tables::Plain => conn.prepare_cached(INSERT)?.execute(params![key]),
            Tables::Store => conn.prepare_cached(INSERT_RECORD)?.execute(params![
                key,
                [7u8; 16],
                now + 30_000,
                i64::try_from(fence).expect("fits"),
                now,
                now + 3_600_000
            ]),
        }
    };
    let complete = |key: String| {
        let now = now_ms();
        match tables {
            Tables::Plain => conn.prepare_cached(UPDATE)?.execute(params![key, RESPONSE]),
            Tables::Store => conn.prepare_cached(UPDATE_RECORD)?.execute(params![
                key,
                RESPONSE,
                now,
                now + 3_600_000
            ]),
        }
    };
    let start = Instant::now();
    let mut batch = 0u64;
    while start.elapsed() < run {
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        for slot in 0..width {
            claim(key(batch, slot), batch * width + slot).expect("claim");
        }
        if let Some(before) = batch.checked_sub(1) {
            for slot in 0..width {
                complete(key(before, slot)).expect("complete");
            }
        }
        conn.execute_batch("COMMIT").expect("commit");
        batch += 1;
    }
    // The last batch's claims were never completed.
    (batch.saturating_sub(1) * width) as f64 / start.elapsed().as_secs_f64()
}

async fn idem_store(store: SqliteStore, callers: usize, keys: Keys, run: Duration) -> f64 {
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let pairs = Arc::new(AtomicU64::new(0));
    let sequence = Arc::new(AtomicU64::new(0));
    let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600));
    let start = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|c| {
            let (store, stop, pairs, sequence, params) = (
                Arc::clone(&store),
                Arc::clone(&stop),
                Arc::clone(&pairs),
                Arc::clone(&sequence),
                params.clone(),
            );
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = match keys {
                        Keys::Sequential => plain_key(sequence.fetch_add(1, Ordering::Relaxed)),
                        Keys::Callers => format!("order-{c}-{i}:charge:v1"),
                    };
                    let id = RecordId::parse("bench", &key).expect("valid");
                    pair(
                        &*store,
                        &id,
                        &params,
                        Bytes::from_static(RESPONSE),
                        Duration::from_secs(3600),
                    )
                    .await;
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
    println!(
        "| callers | durability | keys | plain, 1 txn | plain, 2 txns | plain, batched \
         | store's tables, batched | its tables at the callers' width | SqliteStore \
         | store / 1 txn | store / 2 txns | store / batched | store / its tables batched \
         | store / its tables at the callers' width |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let callers_rows: Vec<usize> = std::env::var("IDEM_BENCH_CALLERS")
        .unwrap_or_else(|_| "1,16,64".to_owned())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("IDEM_BENCH_CALLERS: numbers, comma-separated")
        })
        .collect();
    let durabilities = match std::env::var("IDEM_BENCH_DURABILITY").as_deref() {
        Ok("full") => vec![Durability::Full],
        Ok("normal") => vec![Durability::Normal],
        Err(_) | Ok("") => vec![Durability::Full, Durability::Normal],
        Ok(other) => panic!("IDEM_BENCH_DURABILITY: full or normal, not {other:?}"),
    };
    for durability in durabilities {
        let one = plain(dir.path(), durability, false, run);
        let two = plain(dir.path(), durability, true, run);
        let ceilings = [Keys::Callers, Keys::Sequential].map(|keys| {
            let ceiling = |tables| batched(dir.path(), durability, (64, 64), (keys, tables), run);
            (keys, (ceiling(Tables::Plain), ceiling(Tables::Store)))
        });
        for &callers in &callers_rows {
            let rates = ceilings.map(|(keys, ceiling)| {
                let at_width = (callers >= 2).then(|| {
                    let width = callers as u64 / 2;
                    let shape = (width, callers as u64);
                    batched(dir.path(), durability, shape, (keys, Tables::Store), run)
                });
                let path = dir
                    .path()
                    .join(format!("idem-{callers}-{durability:?}-{keys:?}.db"));
                let store = SqliteStore::builder(&path)
                    .durability(durability)
                    .open()
                    .expect("open");
                (
                    keys,
                    ceiling,
                    at_width,
                    rt.block_on(idem_store(store, callers, keys, run)),
                )
            });
            for (keys, (plain, tables), at_width, rate) in rates {
                println!(
                    "| {callers} | {durability:?} | {keys:?} | {one:.0} | {two:.0} | {plain:.0} \
                     | {tables:.0} | {} | {rate:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                    at_width.map_or("–".to_owned(), |r| format!("{r:.0}")),
                    rate / one,
                    rate / two,
                    rate / plain,
                    rate / tables,
                    at_width.map_or("–".to_owned(), |r| format!("{:.2}", rate / r)),
                );
            }
        }
    }
}
