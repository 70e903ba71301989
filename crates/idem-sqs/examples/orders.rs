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

use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, KeyExtractor};
use idem_dynamodb::DynamoStore;
use idem_sqs::SqsConsumer;
use idem_testkit::consumers::till::{all_seen, report, sent_orders, Till, DELIVERIES};
use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};

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

    for (_key, body) in &sent_orders() {
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

    // The charge is the one effect that must happen once.
    let till = Till::default();
    let charge = till.clone();
    let consumer = orders.consumer().clone();
    let done = all_seen(&consumer, DELIVERIES);
    orders
        .run(move |job| std::future::ready(charge.charge(&job)), done)
        .await?;

    for url in [queue.as_str(), orders.dead_letter_queue()] {
        sqs.delete_queue().queue_url(url).send().await?;
    }
    dynamo.delete_table().table_name(&name).send().await?;
    report(&consumer, &till, orders.dead_letter_queue())
}
