//! Messages per second through `NatsConsumer` (a handler that does
//! nothing) against the same JetStream consumer drained by a plain
//! async-nats loop that only acks, in the same run: the overhead of the
//! middleware at the server's own throughput on this machine. The
//! middleware runs twice: with the in-process memory store (the consumer
//! layer's own cost, no store I/O) and with the Redis store. Each row also
//! says where the CPU went, per message: this process (the client),
//! redis-server (`INFO cpu`) and the rest of the machine (nats-server,
//! mostly).
//!
//! Run: `cargo bench -p idem-nats --bench throughput [-- --messages N --rounds R]`
//!
//! Starts its own nats-server (JetStream, file store) and redis-server.
//! Each round fills a fresh stream with N messages per consumer, then
//! drains it once with each (a durable pull consumer each, explicit acks);
//! all take the same batches and process messages concurrently.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::AckPolicy;
use async_nats::jetstream::{self, stream, Context};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use idem::{Idempotency, MemoryStore, Scope, Store};
use idem_consumer::Consumer;
use idem_nats::NatsConsumer;
use idem_redis::RedisStore;
use idem_testkit::bench::{count_arg, Phase};
use idem_testkit::nats::NatsServer;
use idem_testkit::redis::RedisServer;

const CONCURRENCY: [usize; 2] = [16, 64];

/// Publishes in windows of 1,000 unacknowledged messages (the client
/// holds back publishes beyond its in-flight ack limit).
async fn fill(js: &Context, subject: &str, messages: usize) {
    let mut pending = Vec::with_capacity(1000);
    for i in 0..messages {
        if pending.len() == 1000 {
            for ack in pending.drain(..) {
                let ack: jetstream::context::PublishAckFuture = ack;
                ack.await.expect("stored");
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert("Idempotency-Key", format!("{subject}-{i}").as_str());
        pending.push(
            js.publish_with_headers(
                subject.to_owned(),
                headers,
                br#"{"order":1,"amount":1250}"#.as_slice().into(),
            )
            .await
            .expect("publish"),
        );
    }
    for ack in pending {
        ack.await.expect("stored");
    }
}

/// A plain pull consumer: each message acked in its own task, at most
/// `concurrency` at once, as the middleware does.
async fn raw(js: &Context, stream: &str, concurrency: usize, messages: usize) -> f64 {
    let consumer = js
        .get_stream(stream)
        .await
        .expect("stream")
        .get_or_create_consumer(
            "plain",
            PullConfig {
                durable_name: Some("plain".to_owned()),
                ack_policy: AckPolicy::Explicit,
                max_ack_pending: concurrency as i64,
                filter_subject: format!("{stream}.plain"),
                ..PullConfig::default()
            },
        )
        .await
        .expect("consumer");
    let mut stream = consumer
        .stream()
        .max_messages_per_batch(concurrency)
        .messages()
        .await
        .expect("messages");
    let acked = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut in_flight = tokio::task::JoinSet::new();
    let mut taken = 0;
    while taken < messages {
        if in_flight.len() >= concurrency {
            in_flight.join_next().await;
            continue;
        }
        let message = stream.next().await.expect("open").expect("message");
        taken += 1;
        let acked = Arc::clone(&acked);
        in_flight.spawn(async move {
            message.ack().await.expect("ack");
            acked.fetch_add(1, Ordering::Relaxed);
        });
    }
    while in_flight.join_next().await.is_some() {}
    messages as f64 / start.elapsed().as_secs_f64()
}

/// Drains the messages on `<stream>.<subject>` through the middleware, as
/// the durable consumer `subject`.
async fn through_idem<S: Store>(
    url: &str,
    stream: &str,
    subject: &str,
    store: S,
    concurrency: usize,
    messages: usize,
) -> f64 {
    let idem = Idempotency::builder(store).build().expect("config");
    let consumer = Consumer::builder(idem, Scope::new("bench").expect("scope")).build();
    let nats = NatsConsumer::builder(url, stream, subject, consumer)
        .concurrency(concurrency)
        .filter_subject(format!("{stream}.{subject}"))
        .connect()
        .await
        .expect("connect");
    let stats = nats.consumer().clone();
    let done = async move {
        while stats.stats().executed < messages as u64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let start = Instant::now();
    nats.run(|_job| async { Ok::<_, std::io::Error>(()) }, done)
        .await
        .expect("run");
    let stats = nats.consumer().stats();
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
    let server = NatsServer::start().expect("nats-server");
    let redis = RedisServer::start().expect("redis-server");
    let url = server.url();
    let js = jetstream::new(async_nats::connect(url.as_str()).await.expect("connect"));
    println!(
        "JetStream consumer throughput, {messages} messages per drain, median of {rounds} rounds"
    );
    println!(
        "| concurrency | plain async-nats loop (msg/s) | through idem, memory store (msg/s) \
         | ratio | through idem + Redis (msg/s) | ratio | CPU us/msg, client / Redis / rest: \
         plain | memory | Redis |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---|---|---|");
    let redis_cpu = || redis.cpu().expect("INFO cpu");
    for concurrency in CONCURRENCY {
        let (mut plain, mut memory, mut guarded) =
            (Phase::default(), Phase::default(), Phase::default());
        for _ in 0..rounds {
            let name = format!("BENCH_{:08x}", rand::random::<u32>());
            js.create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.*")],
                max_age: Duration::from_secs(3600),
                ..Default::default()
            })
            .await
            .expect("stream");
            fill(&js, &format!("{name}.plain"), messages).await;
            let drain = raw(&js, &name, concurrency, messages);
            plain.measure(messages, redis_cpu, drain).await;
            fill(&js, &format!("{name}.memory"), messages).await;
            let drain = through_idem(
                &url,
                &name,
                "memory",
                MemoryStore::new(),
                concurrency,
                messages,
            );
            memory.measure(messages, redis_cpu, drain).await;
            fill(&js, &format!("{name}.redis"), messages).await;
            let store = RedisStore::builder(&redis.url())
                .expect("url")
                .namespace(name.clone())
                .connect()
                .await
                .expect("redis");
            let drain = through_idem(&url, &name, "redis", store, concurrency, messages);
            guarded.measure(messages, redis_cpu, drain).await;
            let _ = js.delete_stream(&name).await;
            let _ = js.delete_stream(format!("{name}_DEAD")).await;
        }
        let (p, m, g) = (plain.rate(), memory.rate(), guarded.rate());
        println!(
            "| {concurrency} | {p:.0} | {m:.0} | {:.2} | {g:.0} | {:.2} | {} | {} | {} |",
            m / p,
            g / p,
            plain.cpu(),
            memory.cpu(),
            guarded.cpu()
        );
    }
}
