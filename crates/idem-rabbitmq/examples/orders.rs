//! Orders from RabbitMQ, charged exactly once.
//!
//! Publishes 100 orders, each twice (a producer that retried), and one
//! order the handler refuses; consumes them through idem with a Redis
//! store; prints what happened and exits.
//!
//! Run: `cargo run -p idem-rabbitmq --example orders`
//! (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`, and
//! `REDIS_URL`, default `redis://127.0.0.1:6379`).

#![allow(clippy::print_stdout)] // an example reports on stdout

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Idempotency, Scope, Terminal};
use idem_consumer::Consumer;
use idem_rabbitmq::RabbitConsumer;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

#[derive(serde::Deserialize)]
struct Order {
    amount: u64,
}

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
    let mut orders: Vec<(String, String)> = (1..=100)
        .flat_map(|n| {
            let order = (
                format!("order-{n}"),
                format!(r#"{{"amount": {}}}"#, n * 100),
            );
            [order.clone(), order]
        })
        .collect();
    orders.push(("order-bad".to_owned(), r#"{"amount": "lots"}"#.to_owned()));
    for (key, body) in &orders {
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

    let charged = Arc::new(AtomicU64::new(0));
    let total = Arc::clone(&charged);
    let stats = rabbit.consumer().clone();
    let all_seen = async move {
        while stats.stats().executed + stats.stats().replayed + stats.stats().dead_letters < 201 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    rabbit
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

    let stats = rabbit.consumer().stats();
    println!(
        "executed {}, duplicates replayed {}, dead-lettered {} (to {})",
        stats.executed,
        stats.replayed,
        stats.dead_letters,
        rabbit.dead_letter_queue()
    );
    println!(
        "charged {} in total; 100 orders of 100..=10000 come to {}",
        charged.load(Ordering::SeqCst),
        (1..=100u64).map(|n| n * 100).sum::<u64>()
    );
    for name in rabbit.queues() {
        channel
            .queue_delete(name.as_str().into(), Default::default())
            .await?;
    }
    Ok(())
}
