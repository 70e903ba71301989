//! The outbox between two SQS consumers
//! ([`pipeline`](idem_testkit::consumers::pipeline)), on moto: consumer A
//! applies its effect and emits to B's queue through the outbox; B
//! applies its own. With duplicates at A's input, A's link refusing sends
//! after A stored its outcomes (so its messages are deleted with nothing
//! sent), and A "killed" after sending and before the answer, every
//! input's effect happens once at A and once at B, and no emitted message
//! is lost. On a FIFO queue for B, SQS itself drops the copies sent again
//! (the message id is the deduplication id).

#[allow(dead_code)] // the rest serves tests/queues.rs
mod common;

use std::time::Duration;

use common::Setup;
use idem::outbox::{Message, SendError, Sender};
use idem_dynamodb::DynamoStore;
use idem_sqs::{SqsConsumer, SqsMessage, SqsSender};
use idem_testkit::consumers::pipeline::{self, Effects, FirstPhase, INPUTS};

async fn consumer(setup: &Setup, sender: impl Sender) -> SqsConsumer<DynamoStore, idem::Json> {
    let idem = pipeline::executor(setup.store(), sender);
    setup.sqs_with(&setup.endpoint, idem).await
}

/// Runs `consumer` in a task with the handler of its hop.
fn spawn(
    consumer: SqsConsumer<DynamoStore, idem::Json>,
    effects: &Effects,
    to: Option<String>,
) -> tokio::task::JoinHandle<()> {
    let handler = pipeline::hop::<SqsMessage>(effects, to);
    tokio::spawn(async move {
        let _ = consumer.run(handler, std::future::pending()).await;
    })
}

async fn pipeline(fifo_b: bool) {
    let (a, b) = (
        Setup::new("pipe-a", false).await,
        Setup::new("pipe-b", fifo_b).await,
    );
    let (at_a, at_b) = (Effects::default(), Effects::default());
    for n in 0..INPUTS {
        let key = format!("order-{n}");
        for _duplicate in 0..2 {
            a.send(Some(&key), "{}", None).await;
        }
    }

    // Phase 1: every input applied at A; then A's process dies.
    let first = consumer(&a, FirstPhase::new(SqsSender::new(a.client()))).await;
    let phase1 = spawn(first, &at_a, Some(b.queue_url.clone()));
    at_a.wait_for(INPUTS, "A").await;
    pipeline::wait_completed(&a.store(), &at_a).await;
    phase1.abort();
    let _ = phase1.await;

    // Phase 2: A again with a working link and a dispatcher, and B.
    let second = consumer(&a, SqsSender::new(a.client())).await;
    let dispatcher = second
        .consumer()
        .idempotency()
        .spawn_outbox_dispatcher(Duration::from_millis(200));
    let phase2 = spawn(second, &at_a, Some(b.queue_url.clone()));
    let hop_b = spawn(consumer(&b, SqsSender::new(b.client())).await, &at_b, None);
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
async fn a_two_hop_pipeline_applies_every_effect_once_and_loses_no_message() {
    pipeline(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_hop_pipeline_into_a_fifo_queue_applies_every_effect_once() {
    pipeline(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_sqs_cannot_take_is_refused() {
    let setup = Setup::new("refuse", false).await;
    let sender = SqsSender::new(setup.client());
    let binary = Message::new(setup.queue_url.clone(), vec![0xff, 0xfe]);
    assert!(matches!(
        sender.send(&binary).await,
        Err(SendError::Refused(_))
    ));
    let crowded = (0..11).fold(Message::new(setup.queue_url.clone(), "x"), |m, n| {
        m.header(format!("h{n}"), "v")
    });
    assert!(matches!(
        sender.send(&crowded).await,
        Err(SendError::Refused(_))
    ));
}
