//! Orders from Amazon SQS, charged exactly once.
//!
//! Creates a queue and a DynamoDB table for the store, sends 100 orders,
//! each twice (a producer that retried after a lost answer, so the queue
//! holds both), and one order the handler refuses; consumes them through
//! idem keyed by the order id in the payload; prints what happened, and
//! exits non-zero if any order was charged other than once.
//!
//! Run: `cargo run -p idem-sqs --example orders`. With `SQS_ENDPOINT` it
//! uses that endpoint for SQS and DynamoDB (credentials and region from
//! the environment); without, it starts a `moto_server` on a free
//! loopback port (`scripts/test` installs it).

#![allow(clippy::print_stdout)] // an example reports on stdout

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use idem::{Idempotency, Scope, Terminal};
use idem_consumer::{Consumer, KeyExtractor};
use idem_dynamodb::DynamoStore;
use idem_sqs::SqsConsumer;
use idem_testkit::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};

#[derive(serde::Deserialize)]
struct Order {
    amount: u64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, sqs, dynamo) = match std::env::var("SQS_ENDPOINT") {
        Ok(endpoint) => (
            None,
            idem_sqs::client_from_env(Some(&endpoint))?,
            idem_dynamodb::client_from_env(Some(&endpoint))?,
        ),
        Err(_) => {
            let server = MotoServer::start()?;
            let url = server.url();
            (
                Some(server),
                idem_sqs::client_for(Some(&url), REGION, ACCESS_KEY, SECRET_KEY, None)?,
                idem_dynamodb::client_for(Some(&url), REGION, ACCESS_KEY, SECRET_KEY, None)?,
            )
        }
    };
    let name = format!("idem-example-{:08x}", rand::random::<u32>());

    let queue = sqs
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "3600")
        .attributes(QueueAttributeName::VisibilityTimeout, "30")
        .send()
        .await?
        .queue_url
        .ok_or("no queue URL")?;
    idem_dynamodb::create_table(&dynamo, &name).await?;

    let mut bodies: Vec<String> = (1..=100)
        .flat_map(|n| {
            let body = format!(r#"{{"id": "order-{n}", "amount": {}}}"#, n * 100);
            [body.clone(), body]
        })
        .collect();
    bodies.push(r#"{"id": "order-bad", "amount": "lots"}"#.to_owned());
    for body in &bodies {
        sqs.send_message()
            .queue_url(&queue)
            .message_body(body)
            .send()
            .await?;
    }

    let idem = Idempotency::builder(DynamoStore::new(dynamo.clone(), name.clone())).build()?;
    let consumer = Consumer::builder(idem, Scope::new("orders")?)
        .keys(KeyExtractor::json_pointer("/id"))
        .build();
    let orders = SqsConsumer::builder(sqs.clone(), &queue, consumer)
        .wait_time(Duration::from_secs(1))
        .connect()
        .await?;

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
        "executed {}, duplicates replayed {}, dead-lettered {} (to {})",
        stats.executed,
        stats.replayed,
        stats.dead_letters,
        orders.dead_letter_queue()
    );
    println!("charged {charged} in total; 100 orders of 100..=10000 come to {expected}");
    for url in [queue.as_str(), orders.dead_letter_queue()] {
        sqs.delete_queue().queue_url(url).send().await?;
    }
    dynamo.delete_table().table_name(&name).send().await?;
    if charged != expected || stats.dead_letters != 1 {
        return Err("an order was charged other than once".into());
    }
    Ok(())
}
