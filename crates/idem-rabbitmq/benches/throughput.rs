//! Messages per second through `RabbitConsumer` (a handler that does
//! nothing) against the same broker consumed by a plain lapin loop that
//! only acks, in the same run, as described in
//! [`idem_testkit::bench::consumers`]: the plain loop, the in-memory
//! store, a Redis store, and a Redis store claiming each window together.
//!
//! Run: `cargo bench -p idem-rabbitmq --bench throughput [-- --messages N --rounds R]`
//!
//! Uses the machine's RabbitMQ on 127.0.0.1:5672 if there is one (else
//! starts its own) and starts its own redis-server. Each round declares a
//! fresh queue (through the middleware, so every phase drains the same
//! kind of queue); each phase fills it and drains it.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem::{Idempotency, MemoryStore, Scope, Store};
use idem_consumer::Consumer;
use idem_rabbitmq::RabbitConsumer;
use idem_testkit::bench::consumers::BenchBroker;
use idem_testkit::servers::rabbitmq::RabbitServer;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

async fn fill(channel: &Channel, queue: &str, lane: &str, messages: usize) {
    for i in 0..messages {
        let mut headers = FieldTable::default();
        let key = format!("{queue}-{lane}-{i}");
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

struct Rabbit {
    url: String,
    channel: Channel,
    /// The queues each round's topology declared, to delete after it.
    declared: Mutex<Vec<String>>,
}

impl BenchBroker for Rabbit {
    fn names(&self) -> (&'static str, &'static str) {
        ("RabbitMQ", "lapin")
    }

    async fn create(&self) -> String {
        let queue = format!("idem-bench-{:08x}", rand::random::<u32>());
        let idem = Idempotency::builder(MemoryStore::new())
            .build()
            .expect("config");
        let consumer = Consumer::builder(idem, Scope::new("bench").expect("scope")).build();
        let queues = RabbitConsumer::builder(&self.url, &queue, consumer)
            .redelivery_window(Duration::from_secs(3600))
            .connect()
            .await
            .expect("declare")
            .queues();
        self.declared.lock().expect("lock").extend(queues);
        queue
    }

    async fn fill(&self, dest: &str, lane: &str, messages: usize) {
        fill(&self.channel, dest, lane, messages).await;
    }

    async fn plain(&self, dest: &str, concurrency: usize, messages: usize) -> f64 {
        raw(&self.url, dest, prefetch(concurrency), messages).await
    }

    async fn run<S: Store>(
        &self,
        dest: &str,
        _lane: &str,
        consumer: Consumer<S>,
        concurrency: usize,
        done: impl Future<Output = ()> + Send + 'static,
    ) {
        RabbitConsumer::builder(&self.url, dest, consumer)
            .prefetch(prefetch(concurrency))
            .redelivery_window(Duration::from_secs(3600))
            .connect()
            .await
            .expect("connect")
            .run(|_job| async { Ok::<_, std::io::Error>(()) }, done)
            .await
            .expect("run");
    }

    async fn remove(&self, _dest: &str) {
        let declared = std::mem::take(&mut *self.declared.lock().expect("lock"));
        for name in declared {
            let _ = self
                .channel
                .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

fn prefetch(concurrency: usize) -> u16 {
    u16::try_from(concurrency).expect("a prefetch fits in u16")
}

#[tokio::main]
async fn main() {
    let broker = RabbitServer::shared().expect("RabbitMQ");
    let url = broker.url().to_owned();
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let rabbit = Rabbit {
        url,
        channel,
        declared: Mutex::default(),
    };
    idem_testkit::consumer_bench!(&rabbit).await;
}
