//! Messages per second through `RabbitConsumer` (a handler that does
//! nothing) against the same broker consumed by a plain lapin loop that
//! only acks, in the same run: the overhead of the middleware at the
//! broker's own throughput on this machine. The middleware runs twice:
//! with the in-process memory store (the consumer layer's own cost, no
//! store I/O) and with the Redis store.
//!
//! Run: `cargo bench -p idem-rabbitmq --bench throughput [-- --messages N --rounds R]`
//!
//! Uses the machine's RabbitMQ on 127.0.0.1:5672 if there is one (else
//! starts its own) and starts its own redis-server. Each round fills a
//! fresh queue with N messages, then drains it once with each consumer;
//! all use the same prefetch and process deliveries concurrently. Each
//! row also says where the CPU went, per message: this process (the
//! client), redis-server (`INFO cpu`) and the rest of the machine (the
//! broker, mostly).

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem::{Idempotency, MemoryStore, Scope, Store};
use idem_consumer::Consumer;
use idem_rabbitmq::RabbitConsumer;
use idem_redis::RedisStore;
use idem_testkit::bench::{count_arg, Phase};
use idem_testkit::rabbitmq::RabbitServer;
use idem_testkit::redis::RedisServer;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

const PREFETCH: [u16; 2] = [16, 64];

async fn fill(channel: &Channel, queue: &str, round: usize, messages: usize) {
    for i in 0..messages {
        let mut headers = FieldTable::default();
        let key = format!("r{round}-{i}");
        headers.insert(
            "Idempotency-Key".into(),
            AMQPValue::LongString(LongString::from(key.into_bytes())),
        );
        let _confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                br#"{"order":1,"amount":1250}"#,
                BasicProperties::default().with_headers(headers),
            )
            .await
            .expect("publish");
    }
    channel.wait_for_confirms().await.expect("confirms");
}

/// A plain consumer: each delivery acked in its own task, as the
/// middleware does.
async fn raw(url: &str, queue: &str, prefetch: u16, messages: usize) -> f64 {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut taken = 0;
    while taken < messages {
        let delivery = deliveries
            .next()
            .await
            .expect("stream open")
            .expect("delivery");
        taken += 1;
        let acked = Arc::clone(&acked);
        tokio::spawn(async move {
            delivery.ack(BasicAckOptions::default()).await.expect("ack");
            acked.fetch_add(1, Ordering::Relaxed);
        });
    }
    while acked.load(Ordering::Relaxed) < messages as u64 {
        tokio::task::yield_now().await;
    }
    let rate = messages as f64 / start.elapsed().as_secs_f64();
    let _ = connection.close(200, "done".into()).await;
    rate
}

async fn through_idem<S: Store>(
    url: &str,
    queue: &str,
    store: S,
    prefetch: u16,
    messages: usize,
) -> f64 {
    let idem = Idempotency::builder(store).build().expect("config");
    let consumer = Consumer::builder(idem, Scope::new("bench").expect("scope")).build();
    let rabbit = RabbitConsumer::builder(url, queue, consumer)
        .prefetch(prefetch)
        .redelivery_window(Duration::from_secs(3600))
        .connect()
        .await
        .expect("connect");
    let stats = rabbit.consumer().clone();
    let done = async move {
        while stats.stats().executed < messages as u64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let start = Instant::now();
    rabbit
        .run(|_job| async { Ok::<_, std::io::Error>(()) }, done)
        .await
        .expect("run");
    let stats = rabbit.consumer().stats();
    assert_eq!(
        (stats.executed, stats.dead_letters),
        (messages as u64, 0),
        "every message executed once"
    );
    messages as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let messages = count_arg("--messages", 20_000);
    let rounds = count_arg("--rounds", 3);
    let broker = RabbitServer::shared().expect("RabbitMQ");
    let redis = RedisServer::start().expect("redis-server");
    let url = broker.url();
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    println!(
        "RabbitMQ consumer throughput, {messages} messages per drain, median of {rounds} rounds"
    );
    println!(
        "| prefetch | plain lapin loop (msg/s) | through idem, memory store (msg/s) | ratio \
         | through idem + Redis (msg/s) | ratio | CPU us/msg, client / Redis / rest: plain \
         | memory | Redis |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|---|---|");
    let redis_cpu = || redis.cpu().expect("INFO cpu");
    for prefetch in PREFETCH {
        let (mut plain, mut memory, mut guarded) =
            (Phase::default(), Phase::default(), Phase::default());
        for round in 0..rounds {
            let queue = format!("idem-bench-{:08x}", rand::random::<u32>());
            let store = RedisStore::builder(&redis.url())
                .expect("url")
                .namespace(queue.clone())
                .connect()
                .await
                .expect("redis");
            // The middleware declares the queue, so every consumer drains
            // the same kind of queue.
            let declare = Idempotency::builder(store.clone()).build().expect("config");
            let topology = RabbitConsumer::builder(
                url,
                &queue,
                Consumer::builder(declare, Scope::new("bench").expect("scope")).build(),
            )
            .redelivery_window(Duration::from_secs(3600))
            .connect()
            .await
            .expect("declare")
            .queues();
            fill(&channel, &queue, round * 3, messages).await;
            let drain = raw(url, &queue, prefetch, messages);
            plain.measure(messages, redis_cpu, drain).await;
            fill(&channel, &queue, round * 3 + 1, messages).await;
            let drain = through_idem(url, &queue, MemoryStore::new(), prefetch, messages);
            memory.measure(messages, redis_cpu, drain).await;
            fill(&channel, &queue, round * 3 + 2, messages).await;
            let drain = through_idem(url, &queue, store, prefetch, messages);
            guarded.measure(messages, redis_cpu, drain).await;
            for name in topology {
                let _ = channel
                    .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
        }
        let (p, m, g) = (plain.rate(), memory.rate(), guarded.rate());
        println!(
            "| {prefetch} | {p:.0} | {m:.0} | {:.2} | {g:.0} | {:.2} | {} | {} | {} |",
            m / p,
            g / p,
            plain.cpu(),
            memory.cpu(),
            guarded.cpu()
        );
    }
}
