//! Exactly-once effects from an at-least-once broker, with crashing workers.
//!
//! An in-process broker (`idem_consumer::MemoryBroker`, at least once,
//! SQS-like visibility) delivers every message 1–3 times. Eight workers
//! consume concurrently through `idem`, on the embedded durable store (a
//! SQLite file in a temporary directory; no servers). Workers crash in the
//! two places real consumers do:
//!
//! - **mid-handler**, before the effect: the lease runs out, the broker
//!   redelivers, and another worker takes the record over (attempt + 1);
//! - **after the outcome is stored but before the ack**: the broker
//!   redelivers and the duplicate is answered from the stored outcome.
//!
//! Flaky downstream calls fail retryably and are retried with backoff. The
//! effect itself is written to a ledger fenced with the lease's fencing
//! number, as a downstream database would be.
//!
//! The summary counts every effect per message: it must show 0 duplicate
//! effects and 0 lost messages, or the program exits with status 1.
//!
//! A crash *between* an external effect and the storing of its outcome is
//! the one window a lease cannot close: for effects in your own database
//! use a transactional inbox (the dedup record written in the same
//! transaction); for external APIs, journaled steps with derived downstream
//! keys. Both exist: see the guide's chapters "Natural idempotency first"
//! and "Side effects: steps and durable handlers" (docs/guide).
//!
//! Run: `cargo run --release -p idem-examples --example exactly_once [messages]`

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{Idempotency, Outcome, RecordId, RunError, Scope};
use idem_consumer::{Broker, MemoryBroker, MemoryMessage, Message, OwnedMessage};
use idem_sqlite::SqliteStore;
use rand::{Rng, SeedableRng};

const WORKERS: usize = 8;
const LEASE: Duration = Duration::from_millis(300);
const VISIBILITY: Duration = Duration::from_millis(400);
const CRASH_MID_HANDLER: f64 = 0.03;
const CRASH_BEFORE_ACK: f64 = 0.03;
const FLAKY_DOWNSTREAM: f64 = 0.03;

#[derive(Debug, Clone)]
struct Payment {
    id: u32,
    cents: u64,
}

impl Payment {
    fn to_message(&self) -> OwnedMessage {
        OwnedMessage::new(format!("{} {}", self.id, self.cents))
    }

    fn from_message(message: &MemoryMessage) -> Self {
        let text = std::str::from_utf8(message.payload()).expect("published as text");
        let (id, cents) = text.split_once(' ').expect("published as \"id cents\"");
        Self {
            id: id.parse().expect("a payment id"),
            cents: cents.parse().expect("an amount"),
        }
    }
}

/// The downstream system the effect lands in: a ledger that rejects writes
/// from a holder older than one it has already seen for the same payment.
#[derive(Default)]
struct Ledger {
    applied: Mutex<HashMap<u32, (u32, u64)>>,
}

impl Ledger {
    fn charge(&self, payment: &Payment, fence: u64) -> bool {
        let mut applied = self.applied.lock().expect("ledger lock");
        let entry = applied.entry(payment.id).or_insert((0, 0));
        if fence < entry.1 {
            return false;
        }
        *entry = (entry.0 + 1, fence);
        true
    }
}

#[derive(Default)]
struct Stats {
    deliveries: AtomicU64,
    executed: AtomicU64,
    replayed: AtomicU64,
    takeovers: AtomicU64,
    in_progress_nacks: AtomicU64,
    retryable_nacks: AtomicU64,
    crashed_mid_handler: AtomicU64,
    crashed_before_ack: AtomicU64,
    stale_acks: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug)]
struct Downstream;

impl std::fmt::Display for Downstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("downstream timed out")
    }
}

impl std::error::Error for Downstream {}

async fn worker(
    broker: MemoryBroker,
    idem: Idempotency<SqliteStore>,
    ledger: Arc<Ledger>,
    stats: Arc<Stats>,
    seed: u64,
) {
    let scope = Scope::new("payments-consumer").expect("valid scope");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    while let Some(delivery) = broker.next().await {
        bump(&stats.deliveries);
        let payment = Payment::from_message(&delivery);
        let id = RecordId::new(
            scope.clone(),
            idem::derive::composite(&["payment", &payment.id.to_string()]).expect("valid key"),
        );
        let crash = rng.random_bool(CRASH_MID_HANDLER);
        let flaky = rng.random_bool(FLAKY_DOWNSTREAM);
        let run = idem.run(&id, None, |ctx| {
            let ledger = Arc::clone(&ledger);
            let payment = payment.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                if crash {
                    // The process dies here, before the effect.
                    std::future::pending::<()>().await;
                }
                if flaky {
                    return Err(Downstream);
                }
                if ctx.ensure_lease().is_err() {
                    return Err(Downstream);
                }
                let fence = ctx.fence().expect("guarded run");
                let applied = ledger.charge(&payment, fence);
                Ok(format!(
                    "charged {} cents (fence {fence}, applied {applied})",
                    payment.cents
                ))
            }
        });
        let outcome = if crash {
            // The handler hangs forever: if it was reached, the worker dies
            // mid-handler and its run is dropped unfinished.
            match tokio::time::timeout(Duration::from_millis(20), run).await {
                Ok(answered_without_running) => answered_without_running,
                Err(_) => {
                    // The delivery is never settled: the broker delivers
                    // it again after the visibility timeout.
                    bump(&stats.crashed_mid_handler);
                    continue;
                }
            }
        } else {
            run.await
        };
        dispose(&broker, &delivery, outcome, &stats, &mut rng).await;
    }
}

async fn dispose(
    broker: &MemoryBroker,
    delivery: &MemoryMessage,
    outcome: Result<Outcome<String>, RunError<Downstream>>,
    stats: &Stats,
    rng: &mut impl Rng,
) {
    match outcome {
        Ok(done) => {
            match done {
                Outcome::Executed { takeover, .. } => {
                    bump(&stats.executed);
                    if takeover {
                        bump(&stats.takeovers);
                    }
                }
                Outcome::Replayed { .. } => bump(&stats.replayed),
                Outcome::Unguarded { .. } => unreachable!("this example fails closed"),
            }
            if rng.random_bool(CRASH_BEFORE_ACK) {
                // Not acked: it comes back after the visibility timeout.
                bump(&stats.crashed_before_ack);
            } else if broker.ack(delivery).await.is_err() {
                // Too late: it was already delivered again.
                bump(&stats.stale_acks);
            }
        }
        Err(error) => {
            let delay = error.retry_after().unwrap_or(Duration::from_millis(100));
            match error {
                RunError::InProgress { .. } => bump(&stats.in_progress_nacks),
                _ => bump(&stats.retryable_nacks),
            }
            if broker.retry(delivery, delay).await.is_err() {
                bump(&stats.stale_acks);
            }
        }
    }
}

#[allow(clippy::print_stdout)]
#[tokio::main]
async fn main() {
    let messages: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let started = Instant::now();
    let broker = MemoryBroker::new().visibility(VISIBILITY);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut published = 0u64;
    for id in 0..messages {
        let payment = Payment {
            id,
            cents: 100 + u64::from(id % 50),
        };
        for _ in 0..rng.random_range(1..=3) {
            broker.publish(payment.to_message());
            published += 1;
        }
    }
    broker.close();
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = SqliteStore::open(dir.path().join("idem.db")).expect("open the store");
    let idem = Idempotency::builder(store)
        .lease(LEASE)
        .max_attempts(std::num::NonZeroU32::new(50).expect("non-zero"))
        .backoff(idem::Backoff::new(
            Duration::from_millis(5),
            Duration::from_millis(100),
        ))
        .build()
        .expect("valid configuration");
    let ledger = Arc::new(Ledger::default());
    let stats = Arc::new(Stats::default());
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            tokio::spawn(worker(
                broker.clone(),
                idem.clone(),
                Arc::clone(&ledger),
                Arc::clone(&stats),
                w as u64,
            ))
        })
        .collect();
    for w in workers {
        w.await.expect("worker");
    }

    let applied = ledger.applied.lock().expect("ledger lock");
    let duplicates = applied.values().filter(|(n, _)| *n > 1).count();
    let lost = (0..messages).filter(|id| !applied.contains_key(id)).count();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!("messages               {messages}");
    println!("published copies       {published}");
    println!("deliveries handled     {}", get(&stats.deliveries));
    println!(
        "handler executions     {} (of which takeovers {})",
        get(&stats.executed),
        get(&stats.takeovers)
    );
    println!("replayed duplicates    {}", get(&stats.replayed));
    println!("in-progress nacks      {}", get(&stats.in_progress_nacks));
    println!("retryable nacks        {}", get(&stats.retryable_nacks));
    println!("crashes mid-handler    {}", get(&stats.crashed_mid_handler));
    println!("crashes before ack     {}", get(&stats.crashed_before_ack));
    println!("settled too late       {}", get(&stats.stale_acks));
    println!(
        "effects applied        {}",
        applied.values().map(|(n, _)| u64::from(*n)).sum::<u64>()
    );
    println!("duplicate effects      {duplicates}");
    println!("lost messages          {lost}");
    println!("elapsed                {:.2?}", started.elapsed());
    if duplicates > 0 || lost > 0 {
        println!("FAILED: every message's effect must be applied exactly once");
        std::process::exit(1);
    }
    println!("OK: every message's effect was applied exactly once");
}
