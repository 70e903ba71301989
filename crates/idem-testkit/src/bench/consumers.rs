//! The consumer throughput benchmark, written once and run per broker:
//! each broker's bench implements [`BenchBroker`] (fill a destination,
//! drain it with a plain loop, run an adapter over it) and calls
//! [`consumer_table`].
//!
//! Each round fills a fresh destination with `messages` small JSON
//! messages per phase, each with its own `Idempotency-Key`, and drains them
//! four ways at the same concurrency: the plain loop that only acks, then
//! through the adapter with the in-memory store (the consumer layer's own
//! cost), with a Redis store (one claim and one complete per message), and
//! with a Redis store claiming each window's deliveries together
//! ([`ConsumerBuilder::claim_ahead`](idem_consumer::ConsumerBuilder::claim_ahead)).
//! The handler does nothing. Each cell's CPU is per message: this process
//! (the client), redis-server and the rest of the machine (the broker,
//! mostly).

use std::future::Future;
use std::time::{Duration, Instant};

use idem::{ClaimMany, Idempotency, MemoryStore, Scope, Store};
use idem_consumer::Consumer;

use super::Phase;
use crate::redis::RedisServer;

/// A broker as the consumer benchmark drives it.
pub trait BenchBroker {
    /// The broker's name and its plain loop's, for the table.
    fn names(&self) -> (&'static str, &'static str);

    /// A fresh destination (queue, stream) for one round; its name.
    fn create(&self) -> impl Future<Output = String>;

    /// Publishes `messages` messages for phase `lane` of `dest`, keyed
    /// `<dest>-<lane>-<i>`, and waits until the broker stored them.
    fn fill(&self, dest: &str, lane: &str, messages: usize) -> impl Future<Output = ()>;

    /// Drains the `plain` phase's messages with the broker's client
    /// alone: each delivery acked in its own task, at most `concurrency`
    /// at once. Returns messages per second.
    fn plain(&self, dest: &str, concurrency: usize, messages: usize) -> impl Future<Output = f64>;

    /// Runs the adapter with `consumer` over phase `lane` of `dest`, at
    /// `concurrency`, until `done` resolves.
    fn run<S: Store>(
        &self,
        dest: &str,
        lane: &str,
        consumer: Consumer<S>,
        concurrency: usize,
        done: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()>;

    /// Removes what [`create`](Self::create) made.
    fn remove(&self, dest: &str) -> impl Future<Output = ()>;
}

/// Prints the table (one row per concurrency, medians of `rounds`) for
/// `broker`, with Redis stores connected by `redis_store(namespace)` to
/// `redis`.
#[allow(clippy::print_stdout)] // the benchmark's report
pub async fn consumer_table<B, R, Fut, S, E>(
    broker: &B,
    redis: &RedisServer,
    redis_store: R,
    concurrencies: &[usize],
    messages: usize,
    rounds: usize,
) where
    B: BenchBroker,
    R: Fn(String) -> Fut,
    Fut: Future<Output = Result<S, E>>,
    S: ClaimMany,
    E: std::fmt::Debug,
{
    let (name, plain_name) = broker.names();
    println!(
        "{name} consumer throughput, {messages} messages per drain, median of {rounds} rounds"
    );
    println!(
        "| concurrency | plain {plain_name} loop (msg/s) | idem, memory store | ratio \
         | idem + Redis | ratio | idem + Redis, claim ahead | ratio \
         | CPU µs/msg client / Redis / rest: plain · memory · Redis · Redis ahead |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let redis_cpu = || redis.cpu().expect("INFO cpu");
    for &concurrency in concurrencies {
        let mut phases: [Phase; 4] = Default::default();
        for _ in 0..rounds {
            let dest = broker.create().await;
            broker.fill(&dest, "plain", messages).await;
            let drain = broker.plain(&dest, concurrency, messages);
            phases[0].measure(messages, redis_cpu, drain).await;
            let runs = [
                ("memory", Runner::Memory),
                ("redis", Runner::Redis { ahead: false }),
                ("ahead", Runner::Redis { ahead: true }),
            ];
            for (phase, (lane, runner)) in phases[1..].iter_mut().zip(runs) {
                broker.fill(&dest, lane, messages).await;
                let drain = async {
                    match runner {
                        Runner::Memory => {
                            let consumer = consumer(MemoryStore::new(), false);
                            drained(broker, &dest, lane, consumer, concurrency, messages).await
                        }
                        Runner::Redis { ahead } => {
                            let store = redis_store(format!("{dest}-{lane}"))
                                .await
                                .expect("a Redis store");
                            let consumer = consumer(store, ahead);
                            drained(broker, &dest, lane, consumer, concurrency, messages).await
                        }
                    }
                };
                phase.measure(messages, redis_cpu, drain).await;
            }
            broker.remove(&dest).await;
        }
        let rates: Vec<f64> = phases.iter().map(Phase::rate).collect();
        let plain = rates[0];
        println!(
            "| {concurrency} | {plain:.0} | {:.0} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {} |",
            rates[1],
            rates[1] / plain,
            rates[2],
            rates[2] / plain,
            rates[3],
            rates[3] / plain,
            phases
                .iter()
                .map(Phase::cpu)
                .collect::<Vec<_>>()
                .join(" · ")
        );
    }
}

#[derive(Clone, Copy)]
enum Runner {
    Memory,
    Redis { ahead: bool },
}

/// A consumer of scope `bench` over `store`, claiming ahead or not.
fn consumer<S: ClaimMany>(store: S, ahead: bool) -> Consumer<S> {
    let idem = Idempotency::builder(store).build().expect("config");
    let builder = Consumer::builder(idem, Scope::new("bench").expect("scope"));
    if ahead {
        builder.claim_ahead().build()
    } else {
        builder.build()
    }
}

/// Runs `consumer` until it executed `messages`; messages per second.
async fn drained<B: BenchBroker, S: Store>(
    broker: &B,
    dest: &str,
    lane: &str,
    consumer: Consumer<S>,
    concurrency: usize,
    messages: usize,
) -> f64 {
    let stats = consumer.clone();
    let done = async move {
        while stats.stats().executed < messages as u64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let start = Instant::now();
    broker
        .run(dest, lane, consumer.clone(), concurrency, done)
        .await;
    let rate = messages as f64 / start.elapsed().as_secs_f64();
    let stats = consumer.stats();
    assert_eq!(
        (stats.executed, stats.dead_letters),
        (messages as u64, 0),
        "every message executed once"
    );
    rate
}
