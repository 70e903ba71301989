//! The adapters' `orders` example, its broker-free part: the orders a
//! producer sent twice, a [`Till`] that charges them, a stop once every
//! delivery was dealt with, and the closing check that each order was
//! charged once. Each adapter's `examples/orders.rs` keeps only what a
//! user of that broker writes: the set-up, the publishing and the run.

use std::error::Error;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Codec, Store, Terminal};
use idem_consumer::{Consumer, Job, Message};

/// Orders in the example, each sent twice.
pub const ORDERS: u64 = 100;

/// Deliveries the example publishes: every order twice, and the bad one.
pub const DELIVERIES: u64 = 2 * ORDERS + 1;

/// The orders as a producer that retried sent them, as (key, JSON body):
/// `order-1` to `order-100`, each twice, with amounts 100 to 10,000, then
/// `order-bad`, whose amount is not a number. The key is also the body's
/// `id`, for consumers that take keys from the payload.
pub fn sent_orders() -> Vec<(String, String)> {
    let mut orders: Vec<(String, String)> = (1..=ORDERS)
        .flat_map(|n| {
            let order = (
                format!("order-{n}"),
                format!(r#"{{"id": "order-{n}", "amount": {}}}"#, n * 100),
            );
            [order.clone(), order]
        })
        .collect();
    orders.push((
        "order-bad".to_owned(),
        r#"{"id": "order-bad", "amount": "lots"}"#.to_owned(),
    ));
    orders
}

/// What the orders come to when each is charged once.
pub fn expected_total() -> u64 {
    (1..=ORDERS).map(|n| n * 100).sum()
}

/// The example's side effect: a running total of the amounts charged.
#[derive(Debug, Clone, Default)]
pub struct Till(Arc<AtomicU64>);

impl Till {
    /// Charges the order in `job`, the one effect that must happen once,
    /// and answers its amount; an order whose amount does not decode is
    /// [`Terminal`] (dead-lettered).
    pub fn charge<M: Message>(&self, job: &Job<M>) -> Result<u64, Terminal> {
        let order: serde_json::Value = job.json()?;
        let amount = order["amount"].as_u64().ok_or_else(|| {
            Terminal::new(format!(
                "the amount {} is not a whole number",
                order["amount"]
            ))
        })?;
        self.0.fetch_add(amount, Ordering::SeqCst);
        Ok(amount)
    }

    /// What was charged in all.
    pub fn total(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Resolves once `consumer` has executed, replayed or dead-lettered
/// `deliveries` deliveries: the example's shutdown signal.
pub fn all_seen<S, C>(consumer: &Consumer<S, C>, deliveries: u64) -> impl Future<Output = ()>
where
    S: Store,
    C: Codec,
{
    let consumer = consumer.clone();
    async move {
        loop {
            let s = consumer.stats();
            if s.executed + s.replayed + s.dead_letters >= deliveries {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Prints what `consumer` did and what `till` charged, and fails unless
/// each order was charged once and the bad one dead-lettered (to
/// `dead_letters`, named in the report).
#[allow(clippy::print_stdout)] // the example's report
pub fn report<S, C>(
    consumer: &Consumer<S, C>,
    till: &Till,
    dead_letters: &str,
) -> Result<(), Box<dyn Error>>
where
    S: Store,
    C: Codec,
{
    let stats = consumer.stats();
    let (charged, expected) = (till.total(), expected_total());
    println!(
        "executed {}, duplicates replayed {}, dead-lettered {} (to {dead_letters})",
        stats.executed, stats.replayed, stats.dead_letters
    );
    println!("charged {charged} in total; {ORDERS} orders of 100..=10000 come to {expected}");
    if charged != expected || stats.dead_letters != 1 {
        return Err("an order was charged other than once".into());
    }
    Ok(())
}
