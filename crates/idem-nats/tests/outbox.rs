//! The outbox between two JetStream consumers
//! ([`pipeline`](idem_testkit::consumers::pipeline)): consumer A applies
//! its effect and emits to B through the outbox; B applies its own. With
//! duplicates at A's input, A's link refusing sends after A stored its
//! outcomes (so its inputs are acked with nothing sent), and A "killed"
//! after sending and before the confirmation, every input's effect
//! happens once at A and once at B, and no emitted message is lost.

#[allow(dead_code)] // the rest serves tests/jetstream.rs
mod common;

use std::time::Duration;

use common::{publish, Setup};
use idem::outbox::Sender;
use idem_nats::{JetStreamSender, NatsConsumer, NatsMessage};
use idem_redis::RedisStore;
use idem_testkit::consumers::pipeline::{self, Effects, FirstPhase, INPUTS};

async fn consumer(setup: &Setup, sender: impl Sender) -> NatsConsumer<RedisStore, idem::Json> {
    setup
        .nats_with(pipeline::executor(setup.store().await, sender))
        .await
}

/// Runs `consumer` in a task with the handler of its hop.
fn spawn(
    consumer: NatsConsumer<RedisStore, idem::Json>,
    effects: &Effects,
    to: Option<String>,
) -> tokio::task::JoinHandle<()> {
    let handler = pipeline::hop::<NatsMessage>(effects, to);
    tokio::spawn(async move {
        let _ = consumer.run(handler, std::future::pending()).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_hop_pipeline_applies_every_effect_once_and_loses_no_message() {
    let (a, b) = (Setup::new("PIPE_A"), Setup::new("PIPE_B"));
    let js = a.create_stream().await;
    b.create_stream().await;
    let (at_a, at_b) = (Effects::default(), Effects::default());
    // A's consumer exists before the first publish, so nothing is skipped.
    let first = consumer(&a, FirstPhase::new(JetStreamSender::new(js.clone()))).await;
    for n in 0..INPUTS {
        for _duplicate in 0..2 {
            publish(&js, &a.subject(), Some(&format!("order-{n}")), "{}").await;
        }
    }

    // Phase 1: every input applied at A; then A's process dies.
    let phase1 = spawn(first, &at_a, Some(b.subject()));
    at_a.wait_for(INPUTS, "A").await;
    pipeline::wait_completed(&a.store().await, &at_a).await;
    phase1.abort();
    let _ = phase1.await;

    // Phase 2: A again with a working link and a dispatcher, and B.
    let second = consumer(&a, JetStreamSender::new(js.clone())).await;
    let dispatcher = second
        .consumer()
        .idempotency()
        .spawn_outbox_dispatcher(Duration::from_millis(200));
    let phase2 = spawn(second, &at_a, Some(b.subject()));
    let hop_b = spawn(
        consumer(&b, JetStreamSender::new(js.clone())).await,
        &at_b,
        None,
    );
    at_b.wait_for(INPUTS, "B").await;
    // Late re-dispatches (a replay, the dispatcher) would show up here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    phase2.abort();
    hop_b.abort();
    drop(dispatcher);

    at_a.assert_each_once("A");
    at_b.assert_each_once("B");
    // JetStream kept one copy of each emitted message: the sends after a
    // lost confirmation carried the same Nats-Msg-Id.
    let kept = js
        .get_stream(&b.stream)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .state
        .messages;
    assert_eq!(kept, INPUTS as u64, "messages JetStream kept for B");
}
