//! idem beside its peers, on one Redis, in one run.
//!
//! - The `idempotent` crate 2.0 (crates.io), as its README shows it: one
//!   `ValkeyStore`, `claim().fingerprint().execute_or_replay()`.
//! - idem's executor on `RedisStore`, with its defaults: `run(id,
//!   fingerprint, handler)`; for replays also with its replay cache off, so
//!   the Redis path is compared too.
//! - AWS Lambda Powertools' idempotency utility (Python) at one caller,
//!   when `--powertools PYTHON` names a Python that has it (the script
//!   installs one).
//!
//! Each case runs at 1, 16 and 64 concurrent callers, on unique keys (every
//! call runs its side effect) and on replays (every call asks again for one
//! of 1,000 keys completed before). The libraries take turns, one round
//! each, for `--rounds N` rounds of `--secs N` seconds; each cell is the
//! range over the rounds. CPU per operation is what this process (the
//! client) and the Redis server (`INFO cpu`) used, in microseconds.
//!
//! Run: `scripts/bench-peers [--secs N] [--rounds N]`
//!
//! It starts its own `redis-server` on a free loopback port.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Fingerprint, Idempotency, Outcome, RecordId};
use idem_redis::RedisStore;
use idem_testkit::bench::{count_arg, rate, secs_arg, CpuMeter};
use idem_testkit::servers::redis::RedisServer;
use idempotent::valkey::ValkeyStore;
use idempotent::{CachedResponse, ExecutionOutcome, IdempotencyKey, IdempotencyStore, Metadata};

const CALLERS: [usize; 3] = [1, 16, 64];
/// Keys completed before a replay phase, asked for again in turn.
const REPLAY_KEYS: u64 = 1_000;
const BODY: &[u8] = br#"{"order":"o-1","amount":4200}"#;
const RESPONSE: &str = r#"{"ok":true}"#;
const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// A library under test.
#[derive(Clone)]
enum Library {
    Peer(ValkeyStore),
    Idem(Arc<Idempotency<RedisStore>>),
}

impl Library {
    /// One call for `key`; whether its side effect ran. Panics on an
    /// error or on an answer that breaks the case (a replay that runs).
    async fn call(&self, key: &str, runs: &AtomicU64) -> bool {
        match self {
            Library::Peer(store) => {
                let key = IdempotencyKey::new(key).expect("valid key");
                let outcome = store
                    .claim(&key, LEASE)
                    .fingerprint("POST /charges", BODY)
                    .execute_or_replay(RETENTION, |_token| async {
                        runs.fetch_add(1, Ordering::Relaxed);
                        Ok(CachedResponse::new(
                            200,
                            Metadata::new(),
                            RESPONSE.as_bytes().to_vec().into(),
                        ))
                    })
                    .await
                    .expect("idempotent");
                match outcome {
                    ExecutionOutcome::Executed(_) => true,
                    ExecutionOutcome::Replayed(_) => false,
                    _ => panic!("unexpected outcome"),
                }
            }
            Library::Idem(idem) => {
                let id = RecordId::parse("bench", key).expect("valid key");
                let fingerprint = Fingerprint::of_bytes(BODY);
                let outcome = idem
                    .run(&id, Some(fingerprint), |_ctx| async {
                        runs.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, std::io::Error>(RESPONSE.to_owned())
                    })
                    .await
                    .expect("idem");
                matches!(outcome, Outcome::Executed { .. })
            }
        }
    }
}

/// One measured phase: operations per second and CPU per operation.
#[derive(Debug, Clone, Copy)]
struct Point {
    rate: f64,
    client_us: f64,
    redis_us: f64,
}

/// `callers` calling `library` for `secs`: on fresh keys (`replays` off)
/// or on the `REPLAY_KEYS` keys under `prefix`, completed first.
async fn measure(
    server: &RedisServer,
    library: &Library,
    prefix: &str,
    replays: bool,
    callers: usize,
    secs: f64,
) -> Point {
    let runs = Arc::new(AtomicU64::new(0));
    if replays {
        for k in 0..REPLAY_KEYS {
            library.call(&format!("{prefix}-r{k}"), &runs).await;
        }
    }
    let before_runs = runs.load(Ordering::Relaxed);
    let before = server.cpu().expect("INFO cpu");
    let meter = CpuMeter::start();
    let (lib, prefix, counted) = (library.clone(), prefix.to_owned(), Arc::clone(&runs));
    let per_second = rate(callers, secs, move |c, i| {
        let (lib, prefix, counted) = (lib.clone(), prefix.clone(), Arc::clone(&counted));
        async move {
            let key = if replays {
                format!("{prefix}-r{}", (c as u64 * 7919 + i * 31) % REPLAY_KEYS)
            } else {
                format!("{prefix}-u{c}-{i}")
            };
            let ran = lib.call(&key, &counted).await;
            assert_eq!(ran, !replays, "{key}: ran {ran}");
            1
        }
    })
    .await;
    let used = meter.stop();
    let redis = server.cpu().expect("INFO cpu").saturating_sub(before);
    let ops = per_second * used.wall.as_secs_f64();
    if replays {
        assert_eq!(runs.load(Ordering::Relaxed), before_runs, "a replay ran");
    }
    Point {
        rate: per_second,
        client_us: used.process.as_secs_f64() * 1e6 / ops,
        redis_us: redis.as_secs_f64() * 1e6 / ops,
    }
}

/// `lo–hi` of `values`, formatted by `f`.
fn range(values: &[f64], f: impl Fn(f64) -> String) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if f(lo) == f(hi) {
        f(lo)
    } else {
        format!("{}–{}", f(lo), f(hi))
    }
}

fn thousands(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{:.1}k", v / 1000.0)
    }
}

fn micros(v: f64) -> String {
    format!("{v:.1}")
}

fn ratio(v: f64) -> String {
    format!("{v:.2}")
}

/// The named argument's value, if given.
fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

/// Runs Powertools' script on `port`: its rates by case name.
fn powertools(python: &str, port: u16, secs: f64) -> Vec<(String, f64)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/powertools.py");
    let out = Command::new(python)
        .args([script, &port.to_string(), &secs.to_string()])
        .arg(REPLAY_KEYS.to_string())
        .output()
        .expect("run the Powertools script");
    assert!(
        out.status.success(),
        "Powertools script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (name, rate) = line.split_once(' ')?;
            Some((name.to_owned(), rate.parse().ok()?))
        })
        .collect()
}

#[tokio::main]
async fn main() {
    let secs = secs_arg(5.0);
    let rounds = count_arg("--rounds", 3);
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let peer = Library::Peer(
        ValkeyStore::with_url(url.clone())
            .prefix("peer")
            .try_build()
            .await
            .expect("ValkeyStore"),
    );
    let store = RedisStore::connect(&url).await.expect("RedisStore");
    let idem = Library::Idem(Arc::new(
        Idempotency::builder(store.clone()).build().expect("idem"),
    ));
    let idem_uncached = Library::Idem(Arc::new(
        Idempotency::builder(store)
            .replay_cache_bytes(0)
            .build()
            .expect("idem"),
    ));

    println!("Redis {url}, {rounds} rounds of {secs} s per cell; CPU in µs per operation\n");
    println!("| case | callers | library | ops/s | client CPU | Redis CPU | ops/s ÷ idempotent |");
    println!("|---|---|---|---|---|---|---|");
    let mut one_caller = Vec::new();
    for replays in [false, true] {
        let case = if replays { "replays" } else { "unique keys" };
        for callers in CALLERS {
            let mut libraries = vec![("`idempotent` 2.0", &peer), ("idem", &idem)];
            if replays {
                libraries.push(("idem, replay cache off", &idem_uncached));
            }
            let mut points: Vec<Vec<Point>> = vec![Vec::new(); libraries.len()];
            for round in 0..rounds {
                for turn in 0..libraries.len() {
                    // Each round starts with the next library.
                    let at = (turn + round) % libraries.len();
                    let prefix = format!("{case}-{callers}-{round}-{at}").replace(' ', "_");
                    let point =
                        measure(&server, libraries[at].1, &prefix, replays, callers, secs).await;
                    points[at].push(point);
                }
            }
            for (at, (name, _)) in libraries.iter().enumerate() {
                let of = |f: fn(&Point) -> f64| points[at].iter().map(f).collect::<Vec<_>>();
                let ratios: Vec<f64> = points[at]
                    .iter()
                    .zip(&points[0])
                    .map(|(p, peer)| p.rate / peer.rate)
                    .collect();
                println!(
                    "| {case} | {callers} | {name} | {} | {} | {} | {} |",
                    range(&of(|p| p.rate), thousands),
                    range(&of(|p| p.client_us), micros),
                    range(&of(|p| p.redis_us), micros),
                    range(&ratios, ratio),
                );
                if callers == 1 && *name == "idem" {
                    one_caller.push((case, of(|p| p.rate)));
                }
            }
        }
    }
    let Some(python) = arg("--powertools") else {
        return;
    };
    println!(
        "\nPowertools (Python, one caller) on the same Redis, against idem at one caller above:\n"
    );
    println!("| case | Powertools ops/s | idem ops/s ÷ Powertools |");
    println!("|---|---|---|");
    let mut theirs: Vec<Vec<(String, f64)>> = Vec::new();
    for _ in 0..rounds {
        theirs.push(powertools(&python, server.port(), secs));
    }
    for (name, case) in [
        ("unique", "unique keys"),
        ("replays", "replays"),
        ("replays_local_cache", "replays"),
    ] {
        let rates: Vec<f64> = theirs
            .iter()
            .filter_map(|round| round.iter().find(|(n, _)| n == name).map(|(_, r)| *r))
            .collect();
        let ours = &one_caller
            .iter()
            .find(|(c, _)| *c == case)
            .expect("one caller measured")
            .1;
        let ratios: Vec<f64> = ours.iter().zip(&rates).map(|(o, t)| o / t).collect();
        println!(
            "| {} | {} | {} |",
            name.replace('_', " "),
            range(&rates, thousands),
            range(&ratios, ratio)
        );
    }
}
