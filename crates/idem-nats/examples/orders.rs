//! Orders from NATS JetStream, charged exactly once.
//!
//! Creates a stream, publishes 100 orders, each twice with a fresh
//! `Nats-Msg-Id` (a producer that retried after JetStream's duplicate
//! window, so the server stores both), and one order the handler refuses;
//! consumes them through idem with a Redis store keyed by the order id in
//! the payload; prints what happened, and exits non-zero if any order was
//! charged other than once.
//!
//! Run: `cargo run -p idem-nats --example orders`
//! (`NATS_URL`, default `nats://127.0.0.1:4222`, with JetStream, and
//! `REDIS_URL`, default `redis://127.0.0.1:6379`).

#![allow(clippy::print_stdout)] // an example reports on stdout

use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, KeyExtractor};
use idem_nats::NatsConsumer;
use idem_testkit::consumers::till::{all_seen, report, sent_orders, Till, DELIVERIES};

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

    for (i, (_key, body)) in sent_orders().into_iter().enumerate() {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("send-{i}").as_str());
        js.publish_with_headers(format!("{name}.orders"), headers, body.into())
            .await?
            .await?;
    }

    // The charge is the one effect that must happen once.
    let till = Till::default();
    let charge = till.clone();
    let done = all_seen(orders.consumer(), DELIVERIES);
    orders
        .run(move |job| std::future::ready(charge.charge(&job)), done)
        .await?;

    js.delete_stream(&name).await?;
    js.delete_stream(format!("{name}_DEAD")).await?;
    report(orders.consumer(), &till, orders.dead_letter_subject())
}
