//! Orders from RabbitMQ, charged exactly once.
//!
//! Publishes 100 orders, each twice (a producer that retried), and one
//! order the handler refuses; consumes them through idem with a Redis
//! store; prints what happened, and exits non-zero if any order was
//! charged other than once.
//!
//! Run: `cargo run -p idem-rabbitmq --example orders`
//! (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`, and
//! `REDIS_URL`, default `redis://127.0.0.1:6379`).

#![allow(clippy::print_stdout)] // an example reports on stdout

use std::time::Duration;

use idem::{Idempotency, Scope};
use idem_consumer::Consumer;
use idem_rabbitmq::RabbitConsumer;
use idem_testkit::consumers::till::{all_seen, report, sent_orders, Till, DELIVERIES};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let amqp = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let run = format!("{:08x}", rand::random::<u32>());
    let queue = format!("idem-example-orders-{run}");

    let store = idem_redis::RedisStore::builder(&redis)?
        .namespace(format!("example-{run}"))
        .connect()
        .await?;
    let idem = Idempotency::builder(store).build()?;
    let consumer = Consumer::builder(idem, Scope::new("orders")?).build();
    let rabbit = RabbitConsumer::builder(&amqp, &queue, consumer)
        .message_ttl(Duration::from_secs(3600))
        .connect()
        .await?;

    let connection = Connection::connect(&amqp, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for (key, body) in &sent_orders() {
        let mut headers = FieldTable::default();
        headers.insert(
            "Idempotency-Key".into(),
            AMQPValue::LongString(LongString::from(key.as_bytes().to_vec())),
        );
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_headers(headers),
            )
            .await?
            .await?;
    }

    // The charge is the one effect that must happen once.
    let till = Till::default();
    let charge = till.clone();
    let done = all_seen(rabbit.consumer(), DELIVERIES);
    rabbit
        .run(move |job| std::future::ready(charge.charge(&job)), done)
        .await?;

    for name in rabbit.queues() {
        channel
            .queue_delete(name.as_str().into(), Default::default())
            .await?;
    }
    report(rabbit.consumer(), &till, &rabbit.dead_letter_queue())
}
