//! Records per second through `KafkaConsumer` (a handler that does
//! nothing) against the same records drained by a plain rdkafka loop that
//! only stores each offset after reading it, in the same run.
//!
//! Run: `cargo bench -p idem-kafka --bench throughput [-- --messages N --rounds R]`
//!
//! Starts its own Tansu broker (in-memory storage), redis-server and
//! PostgreSQL. First the table every broker's bench prints
//! ([`idem_testkit::bench::consumers`]): topics of 4 partitions in key
//! order, the concurrency being the records in flight per partition, the
//! plain loop and the middleware on the in-memory, Redis and PostgreSQL
//! stores. Then offset order (one record per partition at a time), the
//! order a consumer that needs it pays for, with a Redis store: one claim
//! each, and 64 claimed ahead, against the plain loop, at 4 and 16
//! partitions; with a second plain loop whose local queue is kept small,
//! which reads at the rate the broker serves fetches (the first reads
//! what librdkafka fetched ahead into memory). Each drain is a group of
//! its own; time runs from the first record handled to the last, so
//! joining the group is not counted.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem::{Idempotency, Scope, Store};
use idem_consumer::Consumer;
use idem_kafka::{KafkaConsumer, PartitionOrder};
use idem_redis::RedisStore;
use idem_testkit::bench::consumers::BenchBroker;
use idem_testkit::bench::{count_arg, median};
use idem_testkit::servers::kafka::KafkaServer;
use idem_testkit::servers::redis::RedisServer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

/// The partitions of the shared table's topics.
const PARTITIONS: i32 = 4;
/// The partitions of the offset-order table's topics.
const OFFSET_PARTITIONS: [i32; 2] = [4, 16];
/// Records of one partition claimed ahead in offset order.
const IN_FLIGHT: usize = 64;

/// Creates `topic` and produces `messages` small JSON records to it,
/// keyed by `Idempotency-Key` headers, letting the producer batch them.
async fn fill(bootstrap: &str, topic: &str, partitions: i32, messages: usize) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin");
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1))
        .set("retention.ms", "3600000");
    admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut pending = Vec::with_capacity(1000);
    for i in 0..messages {
        if pending.len() == 1000 {
            for delivery in pending.drain(..) {
                let delivery: rdkafka::producer::DeliveryFuture = delivery;
                delivery.await.expect("sent").expect("stored");
            }
        }
        let key = format!("{topic}-{i}");
        let headers = OwnedHeaders::new().insert(Header {
            key: "Idempotency-Key",
            value: Some(&key),
        });
        let record = FutureRecord::to(topic)
            .key(&key)
            .payload(r#"{"order":1,"amount":1250}"#)
            .headers(headers);
        pending.push(
            producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .expect("queue"),
        );
    }
    for delivery in pending {
        delivery.await.expect("sent").expect("stored");
    }
}

/// A plain group member: reads each record and stores its next offset for
/// auto-commit, the least a consumer that commits after processing does.
/// With `prefetch` librdkafka's own defaults let it fetch far ahead (up to
/// 64 MiB a partition), so once the first record is read the rest are
/// mostly in memory already; without, its local queue holds 64 KiB, so it
/// reads at the rate the broker serves fetches.
async fn raw(bootstrap: &str, topic: &str, messages: usize, prefetch: bool) -> f64 {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-plain-{prefetch}"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.offset.store", "false")
        .set("session.timeout.ms", "6000");
    if !prefetch {
        config.set("queued.max.messages.kbytes", "64");
    }
    let consumer: StreamConsumer = config.create().expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut stream = consumer.stream();
    let mut start = None;
    for _ in 0..messages {
        let record = stream.next().await.expect("open").expect("record");
        start.get_or_insert_with(Instant::now);
        let mut next = TopicPartitionList::new();
        next.add_partition_offset(
            record.topic(),
            record.partition(),
            Offset::Offset(record.offset() + 1),
        )
        .expect("offset");
        consumer.store_offsets(&next).expect("store offset");
    }
    messages as f64 / start.map_or(f64::NAN, |s| s.elapsed().as_secs_f64())
}

/// How the middleware takes a partition's records.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// One at a time, each claimed on its own.
    Offsets,
    /// One at a time, claimed [`IN_FLIGHT`] at once ahead of their runs.
    ClaimAhead,
}

/// Drains `topic` through the middleware, in a group (and a store
/// namespace) of its own.
async fn through_idem(
    bootstrap: &str,
    topic: &str,
    redis: &str,
    mode: Mode,
    messages: usize,
) -> f64 {
    let group = format!("{topic}-idem-{mode:?}");
    let store = RedisStore::builder(redis)
        .expect("url")
        .namespace(group.clone())
        .connect()
        .await
        .expect("redis");
    let idem = Idempotency::builder(store).build().expect("config");
    let consumer = Consumer::builder(idem, Scope::new("bench").expect("scope")).build();
    let mut builder = KafkaConsumer::builder(bootstrap, &group, &[topic], consumer)
        .consumer_set("session.timeout.ms", "6000");
    builder = match mode {
        Mode::Offsets => builder,
        Mode::ClaimAhead => builder.claim_ahead(IN_FLIGHT),
    };
    let kafka = builder.connect().await.expect("connect");
    let stats = kafka.consumer().clone();
    let start: Arc<OnceLock<Instant>> = Arc::default();
    let end: Arc<OnceLock<Instant>> = Arc::default();
    let done = {
        let (stats, end) = (stats.clone(), Arc::clone(&end));
        async move {
            while stats.stats().executed < messages as u64 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let _ = end.set(Instant::now());
        }
    };
    let first = Arc::clone(&start);
    let handled = Arc::new(AtomicU64::new(0));
    kafka
        .run(
            move |_job| {
                let _ = first.set(Instant::now());
                handled.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, std::io::Error>(()) }
            },
            done,
        )
        .await
        .expect("run");
    let stats = stats.stats();
    assert_eq!(
        (stats.executed, stats.dead_letters),
        (messages as u64, 0),
        "every record executed once"
    );
    let (start, end) = (start.get().expect("started"), end.get().expect("ended"));
    messages as f64 / end.duration_since(*start).as_secs_f64()
}

/// Tansu as the shared benchmark drives it: a lane is a topic of its own.
struct Kafka {
    bootstrap: String,
}

impl BenchBroker for Kafka {
    fn names(&self) -> (&'static str, &'static str) {
        ("Kafka", "rdkafka")
    }

    async fn create(&self) -> String {
        format!("bench-{:08x}", rand::random::<u32>())
    }

    async fn fill(&self, dest: &str, lane: &str, messages: usize) {
        fill(
            &self.bootstrap,
            &format!("{dest}-{lane}"),
            PARTITIONS,
            messages,
        )
        .await;
    }

    async fn plain(&self, dest: &str, _concurrency: usize, messages: usize) -> f64 {
        raw(&self.bootstrap, &format!("{dest}-plain"), messages, true).await
    }

    async fn run<S: Store>(
        &self,
        dest: &str,
        lane: &str,
        consumer: Consumer<S>,
        concurrency: usize,
        done: impl Future<Output = ()> + Send + 'static,
    ) {
        let topic = format!("{dest}-{lane}");
        KafkaConsumer::builder(
            &self.bootstrap,
            &format!("{topic}-idem"),
            &[&topic],
            consumer,
        )
        .consumer_set("session.timeout.ms", "6000")
        .partition_order(PartitionOrder::Keys {
            max_in_flight: concurrency,
        })
        .connect()
        .await
        .expect("connect")
        .run(|_job| async { Ok::<_, std::io::Error>(()) }, done)
        .await
        .expect("run");
    }

    async fn remove(&self, dest: &str) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("admin");
        let topics: Vec<String> = ["plain", "memory", "redis", "ahead", "postgres"]
            .iter()
            .map(|lane| format!("{dest}-{lane}"))
            .collect();
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&topics, &AdminOptions::new()).await;
    }
}

#[tokio::main]
async fn main() {
    let broker = KafkaServer::start().expect("tansu");
    let kafka = Kafka {
        bootstrap: broker.bootstrap(),
    };
    idem_testkit::consumer_bench!(&kafka).await;
    offset_order_table(&kafka.bootstrap).await;
}

/// Offset order with a Redis store, against the plain loop.
#[allow(clippy::print_stdout)] // the benchmark's report
async fn offset_order_table(bootstrap: &str) {
    let messages = count_arg("--messages", 20_000);
    let rounds = count_arg("--rounds", 3);
    let redis = RedisServer::start().expect("redis-server");
    println!("\nKafka offset order, {messages} records per drain, median of {rounds} rounds");
    println!(
        "| partitions | plain rdkafka loop (rec/s) | plain, fetching as it reads (rec/s) \
         | idem + Redis, offset order (rec/s) | ratio | \
         offset order, {IN_FLIGHT} claimed ahead (rec/s) | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let modes = [Mode::Offsets, Mode::ClaimAhead];
    for partitions in OFFSET_PARTITIONS {
        let (mut plain, mut fetching) = (Vec::new(), Vec::new());
        let mut guarded: Vec<Vec<f64>> = modes.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            let topic = format!("bench-{:08x}", rand::random::<u32>());
            fill(bootstrap, &topic, partitions, messages).await;
            plain.push(raw(bootstrap, &topic, messages, true).await);
            fetching.push(raw(bootstrap, &topic, messages, false).await);
            for (mode, results) in modes.iter().zip(&mut guarded) {
                results.push(through_idem(bootstrap, &topic, &redis.url(), *mode, messages).await);
            }
        }
        let (p, f) = (median(plain), median(fetching));
        let cells: Vec<String> = guarded
            .into_iter()
            .map(|r| {
                let g = median(r);
                format!("{g:.0} | {:.3}", g / p)
            })
            .collect();
        println!("| {partitions} | {p:.0} | {f:.0} | {} |", cells.join(" | "));
    }
}
