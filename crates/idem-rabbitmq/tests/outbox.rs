//! The outbox between two RabbitMQ consumers
//! ([`pipeline`](idem_testkit::consumers::pipeline)): consumer A applies
//! its effect and emits to B's queue through the outbox, with publisher
//! confirms; B applies its own. With duplicates at A's input, A's link
//! refusing sends after A stored its outcomes (so its inputs are acked
//! with nothing sent), and A "killed" after publishing and before the
//! confirm, every input's effect happens once at A and once at B, and no
//! emitted message is lost. RabbitMQ does not deduplicate: B's copies of
//! a message sent again are answered by B's own claim on the message id.

#[allow(dead_code)] // the rest serves tests/rabbitmq.rs
mod common;

use std::time::Duration;

use common::{publish, publisher, Setup};
use idem::outbox::{Message, Sender};
use idem_rabbitmq::{AmqpMessage, RabbitConsumer, RabbitSender};
use idem_redis::RedisStore;
use idem_testkit::consumers::pipeline::{self, Effects, FirstPhase, INPUTS};

async fn consumer(setup: &Setup, sender: impl Sender) -> RabbitConsumer<RedisStore, idem::Json> {
    let idem = pipeline::executor(setup.store().await, sender);
    setup.rabbit_with(&setup.amqp_url, idem).await
}

/// Runs `consumer` in a task with the handler of its hop.
fn spawn(
    consumer: RabbitConsumer<RedisStore, idem::Json>,
    effects: &Effects,
    to: Option<String>,
) -> tokio::task::JoinHandle<()> {
    let handler = pipeline::hop::<AmqpMessage>(effects, to);
    tokio::spawn(async move {
        let _ = consumer.run(handler, std::future::pending()).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_hop_pipeline_applies_every_effect_once_and_loses_no_message() {
    let (a, b) = (Setup::new("pipe_a"), Setup::new("pipe_b"));
    let (at_a, at_b) = (Effects::default(), Effects::default());
    // Both queues declared before the first publish.
    let first = consumer(&a, FirstPhase::new(RabbitSender::new(&a.amqp_url))).await;
    let downstream = consumer(&b, RabbitSender::new(&b.amqp_url)).await;
    let (_connection, channel) = publisher().await;
    for n in 0..INPUTS {
        for _duplicate in 0..2 {
            publish(&channel, &a.queue, Some(&format!("order-{n}")), "{}").await;
        }
    }

    // Phase 1: every input applied at A; then A's process dies.
    let phase1 = spawn(first, &at_a, Some(b.queue.clone()));
    at_a.wait_for(INPUTS, "A").await;
    pipeline::wait_completed(&a.store().await, &at_a).await;
    phase1.abort();
    let _ = phase1.await;

    // Phase 2: A again with a working link and a dispatcher, and B.
    let second = consumer(&a, RabbitSender::new(&a.amqp_url)).await;
    let dispatcher = second
        .consumer()
        .idempotency()
        .spawn_outbox_dispatcher(Duration::from_millis(200));
    let phase2 = spawn(second, &at_a, Some(b.queue.clone()));
    let hop_b = spawn(downstream, &at_b, None);
    at_b.wait_for(INPUTS, "B").await;
    // Late re-dispatches (a replay, the dispatcher) would show up here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    phase2.abort();
    hop_b.abort();
    drop(dispatcher);

    at_a.assert_each_once("A");
    at_b.assert_each_once("B");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_no_queue_takes_is_refused_and_stays_pending() {
    let sender = RabbitSender::new(common::amqp());
    let message = Message::new(format!("no-such-queue-{:016x}", rand::random::<u64>()), "x");
    let refused = sender.send(&message).await;
    assert!(
        matches!(refused, Err(idem::outbox::SendError::Refused(_))),
        "{refused:?}"
    );
    let down = RabbitSender::new("amqp://guest:guest@127.0.0.1:1/%2f");
    let unavailable = down.send(&message).await;
    assert!(
        matches!(unavailable, Err(idem::outbox::SendError::Unavailable(_))),
        "{unavailable:?}"
    );
}
