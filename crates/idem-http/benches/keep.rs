//! What each replay policy, and sealing at rest, costs per request, beside
//! `full` in the same run: the layer in-process (no sockets) over
//! `MemoryStore`, an inner service answering a JSON body at once,
//! one task on a current-thread runtime sending fresh keys one after
//! another, then a duplicate of each (answered from the replay cache); CPU
//! time per request, read from the schedstat of every thread of the
//! process (a `reference` row's file work runs on Tokio's blocking
//! threads), and wall time. The `reference` row keeps every body in a
//! blob in a temporary directory (threshold 0), each synced before its
//! record is completed; its wall time is mostly the fsyncs. The rows are
//! alternated each round, and the first round is a warm-up, not reported.
//!
//! Run: `cargo bench -p idem-http --bench keep`
//! (`IDEM_BENCH_REQUESTS` per row and round, default 20,000;
//! `IDEM_BENCH_ROUNDS`, default 4 including the warm-up;
//! `IDEM_BENCH_BODY_BYTES`, the answer's size, default 1 KiB).

#![allow(clippy::print_stdout, missing_docs)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idem::blob::{Blobs, DirBlobs};
use idem::codec::{Keyring, KEY_BYTES};
use idem::MemoryStore;
use idem_http::{IdempotencyLayer, ReplayPolicy};
use tower::{service_fn, Layer, Service, ServiceExt};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A JSON answer of about `bytes` (at least 1 KiB) with a secret and a
/// card number in it.
fn answer(bytes: usize) -> Bytes {
    let padding = "x".repeat(bytes.max(1024) - 124);
    Bytes::from(format!(
        r#"{{"id":"ch_123","token":"tok_secret","card":{{"number":"4242424242424242"}},"note":"{padding}"}}"#
    ))
}

const ROWS: [&str; 6] = [
    "full",
    "status-only",
    "redacted",
    "reference",
    "full+sealed",
    "redacted+sealed",
];

fn layer(row: &str, blobs: &std::path::Path) -> IdempotencyLayer<MemoryStore> {
    let mut builder = IdempotencyLayer::builder(MemoryStore::new());
    if row == "reference" {
        builder = builder
            .keep(ReplayPolicy::Reference { threshold: 0 })
            .blobs(Blobs::new(DirBlobs::open(blobs).expect("blob dir")));
    }
    if row.starts_with("status-only") {
        builder = builder.keep(ReplayPolicy::StatusOnly { headers: vec![] });
    }
    if row.starts_with("redacted") {
        builder = builder.keep(ReplayPolicy::Redacted {
            pointers: vec!["/token".into(), "/card/number".into()],
            headers: vec![],
        });
    }
    if row.ends_with("+sealed") {
        builder = builder.keyring(Keyring::new("bench", [7; KEY_BYTES]).expect("key"));
    }
    builder.build().expect("layer")
}

/// CPU nanoseconds and wall microseconds per request of fresh keys, then
/// of their duplicates.
async fn row(row: &str, round: usize, n: usize, blobs: &std::path::Path) -> (Cost, Cost) {
    let body = answer(env("IDEM_BENCH_BODY_BYTES", 1024));
    let inner = service_fn(move |_: Request<Full<Bytes>>| {
        let body = body.clone();
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(Full::new(body))
                    .expect("response"),
            )
        }
    });
    let mut service = layer(row, blobs).layer(inner);
    let fresh = timed(&mut service, row, round, n, false).await;
    let replay = timed(&mut service, row, round, n, true).await;
    (fresh, replay)
}

/// CPU time the process's threads have used, in nanoseconds (Linux's
/// schedstat of each): steadier than wall time on a shared machine.
fn cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// What a request cost: CPU nanoseconds and wall microseconds.
#[derive(Clone, Copy)]
struct Cost {
    cpu_ns: f64,
    wall_us: f64,
}

/// The cost per request of `n` requests (keys `row-round-i`), each
/// checked to be a replay or not as `replays` says.
async fn timed<S>(service: &mut S, row: &str, round: usize, n: usize, replays: bool) -> Cost
where
    S: Service<Request<Full<Bytes>>, Response = Response<idem_http::IdemBody>>,
    S::Error: std::fmt::Debug,
{
    let started = cpu_ns();
    let wall = std::time::Instant::now();
    for i in 0..n {
        let request = Request::post("/charges")
            .header("idempotency-key", format!("{row}-{round}-{i}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(br#"{"amount":1250}"#)))
            .expect("request");
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(request)
            .await
            .expect("response");
        assert_eq!(response.status(), 201);
        assert_eq!(
            response.headers().contains_key("idempotent-replayed"),
            replays
        );
        let _ = response.into_body().collect().await;
    }
    Cost {
        cpu_ns: (cpu_ns() - started) as f64 / n as f64,
        wall_us: wall.elapsed().as_secs_f64() * 1e6 / n as f64,
    }
}

fn main() {
    let n = env("IDEM_BENCH_REQUESTS", 20_000);
    let rounds = env("IDEM_BENCH_ROUNDS", 4);
    let blobs = tempfile::tempdir().expect("blob dir");
    // One thread: the layer's detached run and the caller take turns on
    // it, with no wake-up across threads in the measurement.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "# Replay policies through the layer on MemoryStore, {n} requests per row and round, \
         {} byte answers\n",
        answer(env("IDEM_BENCH_BODY_BYTES", 1024)).len()
    );
    println!(
        "| round | policy | fresh CPU ns/request | / full | fresh wall µs | replay CPU ns/request | / full |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for r in 0..rounds {
        let mut order: Vec<&str> = ROWS.to_vec();
        if r % 2 == 1 {
            order.reverse();
        }
        let mut results = Vec::new();
        for name in order {
            results.push((name, rt.block_on(row(name, r, n, blobs.path()))));
        }
        if r == 0 {
            continue; // warm-up
        }
        let full = results
            .iter()
            .find(|(name, _)| *name == "full")
            .map(|(_, t)| *t)
            .expect("full row");
        results.sort_by_key(|(name, _)| ROWS.iter().position(|n| n == name));
        for (name, (fresh, replay)) in results {
            println!(
                "| {r} | {name} | {:.0} | {:.2} | {:.1} | {:.0} | {:.2} |",
                fresh.cpu_ns,
                fresh.cpu_ns / full.0.cpu_ns,
                fresh.wall_us,
                replay.cpu_ns,
                replay.cpu_ns / full.1.cpu_ns
            );
        }
    }
}
