//! Messages per second through `NatsConsumer` (a handler that does
//! nothing) against the same JetStream stream drained by a plain
//! async-nats loop that only acks, in the same run, as described in
//! [`idem_testkit::bench::consumers`]: the plain loop, the in-memory
//! store, a Redis store, and a Redis store claiming each window together.
//!
//! Run: `cargo bench -p idem-nats --bench throughput [-- --messages N --rounds R]`
//!
//! Starts its own nats-server (JetStream, file store) and redis-server.
//! Each round makes a fresh stream whose subjects are the phases; each
//! phase is drained by a durable pull consumer of its own, explicit acks.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::AckPolicy;
use async_nats::jetstream::{self, stream, Context};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use idem::Store;
use idem_consumer::Consumer;
use idem_nats::NatsConsumer;
use idem_testkit::bench::consumers::BenchBroker;
use idem_testkit::servers::nats::NatsServer;

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
        headers.insert(
            "Idempotency-Key",
            format!("{}-{i}", subject.replace('.', "-")).as_str(),
        );
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

struct JetStream {
    url: String,
    js: Context,
}

impl BenchBroker for JetStream {
    fn names(&self) -> (&'static str, &'static str) {
        ("JetStream", "async-nats")
    }

    async fn create(&self) -> String {
        let name = format!("BENCH_{:08x}", rand::random::<u32>());
        self.js
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.*")],
                max_age: Duration::from_secs(3600),
                ..Default::default()
            })
            .await
            .expect("stream");
        name
    }

    async fn fill(&self, dest: &str, lane: &str, messages: usize) {
        fill(&self.js, &format!("{dest}.{lane}"), messages).await;
    }

    async fn plain(&self, dest: &str, concurrency: usize, messages: usize) -> f64 {
        raw(&self.js, dest, concurrency, messages).await
    }

    async fn run<S: Store>(
        &self,
        dest: &str,
        lane: &str,
        consumer: Consumer<S>,
        concurrency: usize,
        done: impl Future<Output = ()> + Send + 'static,
    ) {
        NatsConsumer::builder(&self.url, dest, lane, consumer)
            .concurrency(concurrency)
            .filter_subject(format!("{dest}.{lane}"))
            .connect()
            .await
            .expect("connect")
            .run(|_job| async { Ok::<_, std::io::Error>(()) }, done)
            .await
            .expect("run");
    }

    async fn remove(&self, dest: &str) {
        let _ = self.js.delete_stream(dest).await;
        let _ = self.js.delete_stream(format!("{dest}_DEAD")).await;
    }
}

#[tokio::main]
async fn main() {
    let server = NatsServer::start().expect("nats-server");
    let url = server.url();
    let js = jetstream::new(async_nats::connect(url.as_str()).await.expect("connect"));
    let broker = JetStream { url, js };
    idem_testkit::consumer_bench!(&broker).await;
}
