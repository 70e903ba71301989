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

use std::time::Duration;

use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, KeyExtractor};
use idem_kafka::KafkaConsumer;
use idem_testkit::consumers::till::{all_seen, report, sent_orders, Till, DELIVERIES};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_broker, bootstrap) = match std::env::var("KAFKA_BOOTSTRAP") {
        Ok(bootstrap) => (None, bootstrap),
        Err(_) => {
            let broker = idem_testkit::servers::kafka::KafkaServer::start()?;
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
    for (key, body) in &sent_orders() {
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

    // The charge is the one effect that must happen once.
    let till = Till::default();
    let charge = till.clone();
    let consumer = orders.consumer().clone();
    let done = all_seen(&consumer, DELIVERIES);
    orders
        .run(move |job| std::future::ready(charge.charge(&job)), done)
        .await?;

    admin
        .delete_topics(&[&topic, &dead_letter_topic], &AdminOptions::new())
        .await?;
    report(&consumer, &till, &dead_letter_topic)
}
