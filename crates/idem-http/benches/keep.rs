//! What each replay policy, and sealing at rest, costs per request, beside
//! `full` in the same run: the layer in-process (no sockets) over
//! `MemoryStore`, an inner service answering a 1 KiB JSON body at once,
//! one task on a current-thread runtime sending fresh keys one after
//! another, then a duplicate of each (answered from the replay cache); CPU
//! time per request, read from the thread's schedstat. The rows are
//! alternated each round, and the first round is a warm-up, not reported.
//!
//! Run: `cargo bench -p idem-http --bench keep`
//! (`IDEM_BENCH_REQUESTS` per row and round, default 20,000;
//! `IDEM_BENCH_ROUNDS`, default 4 including the warm-up).

#![allow(clippy::print_stdout, missing_docs)]

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
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

/// A 1 KiB JSON answer with a secret and a card number in it.
fn answer() -> Bytes {
    let padding = "x".repeat(900);
    Bytes::from(format!(
        r#"{{"id":"ch_123","token":"tok_secret","card":{{"number":"4242424242424242"}},"note":"{padding}"}}"#
    ))
}

const ROWS: [&str; 5] = [
    "full",
    "status-only",
    "redacted",
    "full+sealed",
    "redacted+sealed",
];

fn layer(row: &str) -> IdempotencyLayer<MemoryStore> {
    let mut builder = IdempotencyLayer::builder(MemoryStore::new());
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

/// CPU nanoseconds per request of fresh keys, then of their duplicates.
async fn row(row: &str, round: usize, n: usize) -> (f64, f64) {
    let body = answer();
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
    let mut service = layer(row).layer(inner);
    let fresh = timed(&mut service, row, round, n, false).await;
    let replay = timed(&mut service, row, round, n, true).await;
    (fresh, replay)
}

/// CPU time this thread has used, in nanoseconds (Linux's schedstat):
/// steadier than wall time on a shared machine, and the whole cost, since
/// the layer's detached runs share the current-thread runtime's thread.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat (Linux)")
}

/// CPU nanoseconds per request of `n` requests (keys `row-round-i`), each
/// checked to be a replay or not as `replays` says.
async fn timed<S>(service: &mut S, row: &str, round: usize, n: usize, replays: bool) -> f64
where
    S: Service<Request<Full<Bytes>>, Response = Response<idem_http::IdemBody>>,
    S::Error: std::fmt::Debug,
{
    let started = cpu_ns();
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
    (cpu_ns() - started) as f64 / n as f64
}

fn main() {
    let n = env("IDEM_BENCH_REQUESTS", 20_000);
    let rounds = env("IDEM_BENCH_ROUNDS", 4);
    // One thread: the layer's detached run and the caller take turns on
    // it, with no wake-up across threads in the measurement.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "# Replay policies through the layer on MemoryStore, {n} requests per row and round\n"
    );
    println!("| round | policy | fresh CPU ns/request | / full | replay CPU ns/request | / full |");
    println!("|---:|---|---:|---:|---:|---:|");
    for r in 0..rounds {
        let mut order: Vec<&str> = ROWS.to_vec();
        if r % 2 == 1 {
            order.reverse();
        }
        let mut results = Vec::new();
        for name in order {
            results.push((name, rt.block_on(row(name, r, n))));
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
                "| {r} | {name} | {fresh:.0} | {:.2} | {replay:.0} | {:.2} |",
                fresh / full.0,
                replay / full.1
            );
        }
    }
}
