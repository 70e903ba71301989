//! Orders from Kafka, charged exactly once.
//!
//! Creates a topic with three partitions, produces 100 orders, each twice
//! (a producer that retried after a lost acknowledgement, so the log holds
//! both), and one order the handler refuses; consumes them through idem
//! with a Redis store keyed by the order id in the payload; prints what
//! happened, and exits non-zero if any order was charged other than once.
//!
//! Run: `cargo run -p idem-kafka --example orders`. With `KAFKA_BOOTSTRAP`
//! (`host:port`) it uses that broker; without, it starts a Tansu broker
//! on a free loopback port (`scripts/test` installs it). `REDIS_URL`
//! defaults to `redis://127.0.0.1:6379`.

#![allow(clippy::print_stdout)] // an example reports on stdout

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Idempotency, Scope, Terminal};
use idem_consumer::{Consumer, KeyExtractor};
use idem_kafka::KafkaConsumer;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

#[derive(serde::Deserialize)]
struct Order {
    amount: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_broker, bootstrap) = match std::env::var("KAFKA_BOOTSTRAP") {
        Ok(bootstrap) => (None, bootstrap),
        Err(_) => {
            let broker = idem_testkit::kafka::KafkaServer::start()?;
            let bootstrap = broker.bootstrap();
            (Some(broker), bootstrap)
        }
    };
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let topic = format!("idem-example-{:08x}", rand::random::<u32>());

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let new = NewTopic::new(&topic, 3, TopicReplication::Fixed(-1)).set("retention.ms", "3600000");
    admin.create_topics([&new], &AdminOptions::new()).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let mut bodies: Vec<(String, String)> = (1..=100)
        .flat_map(|n| {
            let body = format!(r#"{{"id": "order-{n}", "amount": {}}}"#, n * 100);
            [
                (format!("order-{n}"), body.clone()),
                (format!("order-{n}"), body),
            ]
        })
        .collect();
    bodies.push((
        "order-bad".to_owned(),
        r#"{"id": "order-bad", "amount": "lots"}"#.to_owned(),
    ));
    for (key, body) in &bodies {
        let record = FutureRecord::to(&topic).key(key).payload(body);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(error, _)| error)?;
    }

    let store = idem_redis::RedisStore::builder(&redis)?
        .namespace(topic.clone())
        .connect()
        .await?;
    let idem = Idempotency::builder(store).build()?;
    let consumer = Consumer::builder(idem, Scope::new("orders")?)
        .keys(KeyExtractor::json_pointer("/id"))
        .build();
    let orders = KafkaConsumer::builder(&bootstrap, "billing", &[&topic], consumer)
        // Tansu holds a new group's first join for about half the session
        // timeout; a short one lets the example start in seconds.
        .consumer_set("session.timeout.ms", "6000")
        .connect()
        .await?;
    let dead_letter_topic = orders.dead_letter_topic(&topic).unwrap_or("?").to_owned();

    let charged = Arc::new(AtomicU64::new(0));
    let total = Arc::clone(&charged);
    let stats = orders.consumer().clone();
    let all_seen = {
        let stats = stats.clone();
        async move {
            loop {
                let s = stats.stats();
                if s.executed + s.replayed + s.dead_letters >= 201 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    orders
        .run(
            move |job| {
                let total = Arc::clone(&total);
                async move {
                    let order: Order = job.json()?;
                    // The charge: the one effect that must happen once.
                    total.fetch_add(order.amount, Ordering::SeqCst);
                    Ok::<_, Terminal>(order.amount)
                }
            },
            all_seen,
        )
        .await?;

    let stats = stats.stats();
    let expected: u64 = (1..=100u64).map(|n| n * 100).sum();
    let charged = charged.load(Ordering::SeqCst);
    println!(
        "executed {}, duplicates replayed {}, dead-lettered {} (to {dead_letter_topic})",
        stats.executed, stats.replayed, stats.dead_letters
    );
    println!("charged {charged} in total; 100 orders of 100..=10000 come to {expected}");
    admin
        .delete_topics(&[&topic, &dead_letter_topic], &AdminOptions::new())
        .await?;
    if charged != expected || stats.dead_letters != 1 {
        return Err("an order was charged other than once".into());
    }
    Ok(())
}
