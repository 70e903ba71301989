//! Orders from NATS JetStream, charged exactly once.
//!
//! Creates a stream, publishes 100 orders, each twice with a fresh
//! `Nats-Msg-Id` (a producer that retried after JetStream's duplicate
//! window, so the server stores both), and one order the handler refuses;
//! consumes them through idem with a Redis store keyed by the order id in
//! the payload; prints what happened and exits.
//!
//! Run: `cargo run -p idem-nats --example orders`
//! (`NATS_URL`, default `nats://127.0.0.1:4222`, with JetStream, and
//! `REDIS_URL`, default `redis://127.0.0.1:6379`).

#![allow(clippy::print_stdout)] // an example reports on stdout

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use idem::{Idempotency, Scope, Terminal};
use idem_consumer::{Consumer, KeyExtractor};
use idem_nats::NatsConsumer;

#[derive(serde::Deserialize)]
struct Order {
    amount: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nats = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let name = format!("IDEM_EXAMPLE_{:08x}", rand::random::<u32>());

    let js = jetstream::new(async_nats::connect(nats.as_str()).await?);
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.orders")],
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await?;

    let store = idem_redis::RedisStore::builder(&redis)?
        .namespace(name.to_lowercase())
        .connect()
        .await?;
    let idem = Idempotency::builder(store).build()?;
    let consumer = Consumer::builder(idem, Scope::new("orders")?)
        .keys(KeyExtractor::json_pointer("/id"))
        .build();
    let orders = NatsConsumer::builder(&nats, &name, "billing", consumer)
        .connect()
        .await?;

    let mut bodies: Vec<String> = (1..=100)
        .flat_map(|n| {
            let body = format!(r#"{{"id": "order-{n}", "amount": {}}}"#, n * 100);
            [body.clone(), body]
        })
        .collect();
    bodies.push(r#"{"id": "order-bad", "amount": "lots"}"#.to_owned());
    for (i, body) in bodies.iter().enumerate() {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("send-{i}").as_str());
        js.publish_with_headers(format!("{name}.orders"), headers, body.clone().into())
            .await?
            .await?;
    }

    let charged = Arc::new(AtomicU64::new(0));
    let total = Arc::clone(&charged);
    let stats = orders.consumer().clone();
    let all_seen = async move {
        while stats.stats().executed + stats.stats().replayed + stats.stats().dead_letters < 201 {
            tokio::time::sleep(Duration::from_millis(20)).await;
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

    let stats = orders.consumer().stats();
    println!(
        "executed {}, duplicates replayed {}, dead-lettered {} (to {})",
        stats.executed,
        stats.replayed,
        stats.dead_letters,
        orders.dead_letter_subject()
    );
    println!(
        "charged {} in total; 100 orders of 100..=10000 come to {}",
        charged.load(Ordering::SeqCst),
        (1..=100u64).map(|n| n * 100).sum::<u64>()
    );
    js.delete_stream(&name).await?;
    js.delete_stream(format!("{name}_DEAD")).await?;
    Ok(())
}
