//! Records per second through `KafkaConsumer` (Redis store, a handler that
//! does nothing) against the same topic drained by a plain rdkafka loop
//! that only stores each offset after reading it, in the same run: the
//! overhead of the middleware at the broker's own throughput on this
//! machine.
//!
//! Run: `cargo bench -p idem-kafka --bench throughput [-- --messages N --rounds R]`
//!
//! Starts its own Tansu broker (in-memory storage) and redis-server. Each
//! round fills a fresh topic with N records and drains it with the plain
//! loop and then through the middleware three ways (offset order; offset
//! order with 64 records claimed ahead; key order with 64 in flight), each
//! in a group of its own. Time runs from the first record read to the
//! last one done, so joining the group is not counted.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem::{Idempotency, Scope};
use idem_consumer::Consumer;
use idem_kafka::{KafkaConsumer, PartitionOrder};
use idem_redis::RedisStore;
use idem_testkit::bench::{count_arg, median};
use idem_testkit::kafka::KafkaServer;
use idem_testkit::redis::RedisServer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

const PARTITIONS: [i32; 2] = [4, 16];
/// Records of one partition claimed ahead, or in flight under key order.
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
async fn raw(bootstrap: &str, topic: &str, messages: usize) -> f64 {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("{topic}-plain"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.offset.store", "false")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("consumer");
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
    /// Up to [`IN_FLIGHT`] different keys at once.
    Keys,
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
        Mode::Keys => builder.partition_order(PartitionOrder::Keys {
            max_in_flight: IN_FLIGHT,
        }),
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

#[tokio::main]
async fn main() {
    let messages = count_arg("--messages", 20_000);
    let rounds = count_arg("--rounds", 3);
    let broker = KafkaServer::start().expect("tansu");
    let redis = RedisServer::start().expect("redis-server");
    let bootstrap = broker.bootstrap();
    println!("Kafka consumer throughput, {messages} records per drain, median of {rounds} rounds");
    println!(
        "| partitions | plain rdkafka loop (rec/s) | idem, offset order (rec/s) | ratio | \
         offset order, {IN_FLIGHT} claimed ahead (rec/s) | ratio | \
         key order, {IN_FLIGHT} in flight (rec/s) | ratio |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let modes = [Mode::Offsets, Mode::ClaimAhead, Mode::Keys];
    for partitions in PARTITIONS {
        let mut plain = Vec::new();
        let mut guarded: Vec<Vec<f64>> = modes.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            let topic = format!("bench-{:08x}", rand::random::<u32>());
            fill(&bootstrap, &topic, partitions, messages).await;
            plain.push(raw(&bootstrap, &topic, messages).await);
            for (mode, results) in modes.iter().zip(&mut guarded) {
                results.push(through_idem(&bootstrap, &topic, &redis.url(), *mode, messages).await);
            }
        }
        let p = median(plain);
        let cells: Vec<String> = guarded
            .into_iter()
            .map(|r| {
                let g = median(r);
                format!("{g:.0} | {:.3}", g / p)
            })
            .collect();
        println!("| {partitions} | {p:.0} | {} |", cells.join(" | "));
    }
}
