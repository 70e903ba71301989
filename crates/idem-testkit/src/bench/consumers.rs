//! The consumer throughput benchmark, written once and run per broker:
//! each broker's bench implements [`BenchBroker`] (fill a destination,
//! drain it with a plain loop, run an adapter over it) and calls
//! [`consumer_bench`].
//!
//! Each round fills a fresh destination with `messages` small JSON
//! messages per phase, each with its own `Idempotency-Key`, and drains them
//! five ways at the same concurrency: the plain loop that only acks, then
//! through the adapter with the in-memory store (the consumer layer's own
//! cost), with a Redis store (one claim and one complete per message,
//! those made together in one script call), with a Redis store claiming
//! each window's deliveries together
//! ([`ConsumerBuilder::claim_ahead`](idem_consumer::ConsumerBuilder::claim_ahead)),
//! and with a PostgreSQL store (claims and completions made together in
//! one statement each). The handler does nothing. Each cell's CPU is per
//! message: this process (the client), the store's server and the rest of
//! the machine (the broker, mostly).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{ClaimMany, Idempotency, MemoryStore, Scope, Store};
use idem_consumer::Consumer;

use super::Phase;
use crate::servers::postgres::PgServer;
use crate::servers::redis::RedisServer;

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

/// A store server the benchmark runs the adapter over: how to connect a
/// store in a namespace of its own, and the server's CPU so far. Made
/// with [`Served`].
trait BenchStore {
    /// The store.
    type Store: ClaimMany;

    /// A store whose records live apart from every other phase's.
    fn connect(&self, namespace: String) -> impl Future<Output = Self::Store>;

    /// The CPU time the store's server has used so far.
    fn cpu(&self) -> Duration;
}

/// A [`BenchStore`] from a connect function (a line in each broker's
/// bench, which knows the store crates) and the server it connects to.
struct Served<'a, F> {
    connect: F,
    cpu: Box<dyn Fn() -> Duration + 'a>,
}

impl<'a, F> Served<'a, F> {
    /// Stores on `server`, connected by `connect(namespace)`.
    fn redis(server: &'a RedisServer, connect: F) -> Self {
        Self {
            connect,
            cpu: Box::new(|| server.cpu().expect("INFO cpu")),
        }
    }

    /// Stores on `server`, connected by `connect(schema)`.
    fn postgres(server: &'a PgServer, connect: F) -> Self {
        Self {
            connect,
            cpu: Box::new(|| server.cpu()),
        }
    }
}

impl<F, Fut, S, E> BenchStore for Served<'_, F>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<S, E>>,
    S: ClaimMany,
    E: std::fmt::Debug,
{
    type Store = S;

    async fn connect(&self, namespace: String) -> S {
        (self.connect)(namespace).await.expect("a store")
    }

    fn cpu(&self) -> Duration {
        (self.cpu)()
    }
}

/// [`consumer_bench`] with the Redis and PostgreSQL stores (the crate that
/// expands it depends on `idem-redis` and `idem-postgres`): a broker's
/// bench is `idem_testkit::consumer_bench!(&broker).await`.
#[macro_export]
macro_rules! consumer_bench {
    ($broker:expr) => {
        $crate::bench::consumers::consumer_bench(
            $broker,
            |url, namespace| {
                ::idem_redis::RedisStore::builder(&url)
                    .expect("a Redis URL")
                    .namespace(namespace)
                    .connect()
            },
            |url, schema| {
                ::idem_postgres::PgStore::builder(&url)
                    .expect("a PostgreSQL URL")
                    .schema(schema)
                    .connect()
            },
        )
    };
}

/// The whole benchmark for `broker`: starts a redis-server and a
/// PostgreSQL server of its own, connects stores with `redis(url,
/// namespace)` and `postgres(url, schema)`, and prints the table at
/// concurrency 16 and 64, over `--messages N` (20,000) and `--rounds R`
/// (3) from the command line.
pub async fn consumer_bench<B, R, RF, RS, RE, P, PF, PS, PE>(broker: &B, redis: R, postgres: P)
where
    B: BenchBroker,
    R: Fn(String, String) -> RF,
    RF: Future<Output = Result<RS, RE>>,
    RS: ClaimMany,
    RE: std::fmt::Debug,
    P: Fn(String, String) -> PF,
    PF: Future<Output = Result<PS, PE>>,
    PS: ClaimMany,
    PE: std::fmt::Debug,
{
    let redis_server = RedisServer::start().expect("redis-server");
    let pg_server = PgServer::start().expect("postgres");
    let database = pg_server.create_database("bench").expect("a database");
    let (redis_url, pg_url) = (redis_server.url(), pg_server.url(&database));
    let redis = Served::redis(&redis_server, |namespace| {
        redis(redis_url.clone(), namespace)
    });
    let postgres = Served::postgres(&pg_server, |schema| postgres(pg_url.clone(), schema));
    let (messages, rounds) = (
        super::count_arg("--messages", 20_000),
        super::count_arg("--rounds", 3),
    );
    consumer_table(broker, &redis, &postgres, &[16, 64], messages, rounds).await;
}

/// Prints the table (one row per concurrency, medians of `rounds`) for
/// `broker`, with stores from `redis` and `postgres`.
#[allow(clippy::print_stdout)] // the benchmark's report
async fn consumer_table<B: BenchBroker>(
    broker: &B,
    redis: &impl BenchStore,
    postgres: &impl BenchStore,
    concurrencies: &[usize],
    messages: usize,
    rounds: usize,
) {
    let (name, plain_name) = broker.names();
    println!(
        "{name} consumer throughput, {messages} messages per drain, median of {rounds} rounds"
    );
    println!(
        "| concurrency | plain {plain_name} loop (msg/s) | idem, memory store | ratio \
         | idem + Redis | ratio | idem + Redis, claim ahead | ratio | idem + PostgreSQL | ratio \
         | CPU µs/msg client / store / rest: plain · memory · Redis · Redis ahead · PostgreSQL |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let no_store = || Duration::ZERO;
    for &concurrency in concurrencies {
        let mut phases: [Phase; 5] = Default::default();
        for _ in 0..rounds {
            let dest = broker.create().await;
            broker.fill(&dest, "plain", messages).await;
            let drain = broker.plain(&dest, concurrency, messages);
            phases[0].measure(messages, no_store, drain).await;
            let memory = "memory";
            broker.fill(&dest, memory, messages).await;
            let run = consumer(MemoryStore::new(), false);
            let drain = drained(broker, &dest, memory, run, concurrency, messages);
            phases[1].measure(messages, no_store, drain).await;
            for (phase, lane, ahead) in [(2, "redis", false), (3, "ahead", true)] {
                broker.fill(&dest, lane, messages).await;
                let run = consumer(redis.connect(format!("{dest}-{lane}")).await, ahead);
                let drain = drained(broker, &dest, lane, run, concurrency, messages);
                phases[phase].measure(messages, || redis.cpu(), drain).await;
            }
            let lane = "postgres";
            broker.fill(&dest, lane, messages).await;
            let schema = format!("{dest}_{lane}").to_lowercase().replace('-', "_");
            let run = consumer(postgres.connect(schema).await, false);
            let drain = drained(broker, &dest, lane, run, concurrency, messages);
            phases[4].measure(messages, || postgres.cpu(), drain).await;
            broker.remove(&dest).await;
        }
        let rates: Vec<f64> = phases.iter().map(Phase::rate).collect();
        let plain = rates[0];
        let cells: Vec<String> = rates[1..]
            .iter()
            .map(|rate| format!("{rate:.0} | {:.2}", rate / plain))
            .collect();
        println!(
            "| {concurrency} | {plain:.0} | {} | {} |",
            cells.join(" | "),
            phases
                .iter()
                .map(Phase::cpu)
                .collect::<Vec<_>>()
                .join(" · ")
        );
    }
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

/// What [`drained`] saw of a run: when the first executed message was
/// seen and how many were done by then, and when the last one was.
#[derive(Debug, Default, Clone, Copy)]
struct Span {
    first: Option<(Instant, u64)>,
    last: Option<Instant>,
}

/// Runs `consumer` until it executed `messages`; messages per second,
/// timed from the first message executed to the last, so that joining a
/// group or subscribing is not counted.
async fn drained<B: BenchBroker, S: Store>(
    broker: &B,
    dest: &str,
    lane: &str,
    consumer: Consumer<S>,
    concurrency: usize,
    messages: usize,
) -> f64 {
    let stats = consumer.clone();
    let span: Arc<Mutex<Span>> = Arc::default();
    let done = {
        let span = Arc::clone(&span);
        async move {
            loop {
                let executed = stats.stats().executed;
                let ended = {
                    let now = Instant::now();
                    let mut span = span.lock().expect("span");
                    if executed > 0 {
                        span.first.get_or_insert((now, executed));
                    }
                    let ended = executed >= messages as u64;
                    if ended {
                        span.last = Some(now);
                    }
                    ended
                };
                if ended {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    broker
        .run(dest, lane, consumer.clone(), concurrency, done)
        .await;
    let Span {
        first: Some((first, done_then)),
        last: Some(last),
    } = *span.lock().expect("span")
    else {
        panic!("the run ended before every message was executed");
    };
    // Timed from the first message seen executed; those done by then are
    // not counted (all of them, if the run took less than a poll).
    let timed = last.duration_since(first).as_secs_f64().max(1e-3);
    let rate = (messages as u64 - done_then.min(messages as u64)).max(1) as f64 / timed;
    let stats = consumer.stats();
    assert_eq!(
        (stats.executed, stats.dead_letters),
        (messages as u64, 0),
        "every message executed once"
    );
    rate
}
