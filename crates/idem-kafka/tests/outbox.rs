//! The outbox between two Kafka consumer groups
//! ([`pipeline`](idem_testkit::consumers::pipeline)): group A applies its
//! effect and emits to B's topic through the outbox; B applies its own.
//! With duplicates at A's input, A's link refusing sends after A stored
//! its outcomes (so its offsets are committed with nothing sent), and A
//! "killed" after producing and before the acknowledgement, every input's
//! effect happens once at A and once at B, and no emitted message is
//! lost. A record produced again is answered by B's claim on its key.

#[allow(dead_code)] // the rest serves tests/kafka.rs
mod common;

use std::time::Duration;

use common::Setup;
use idem::outbox::Sender;
use idem::Scope;
use idem_consumer::{Consumer, KeyExtractor};
use idem_kafka::{KafkaConsumer, KafkaMessage, KafkaSender};
use idem_redis::RedisStore;
use idem_testkit::consumers::pipeline::{self, Effects, FirstPhase, INPUTS, REFUSED};

fn sender(setup: &Setup) -> KafkaSender {
    KafkaSender::new(&setup.bootstrap).expect("producer")
}

async fn consumer(setup: &Setup, sender: impl Sender) -> KafkaConsumer<RedisStore, idem::Json> {
    let idem = pipeline::executor(setup.store().await, sender);
    let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope"))
        .keys(KeyExtractor::header("Idempotency-Key"))
        .build();
    setup.kafka_with(consumer).await
}

/// Runs `consumer` in a task with the handler of its hop.
fn spawn(
    consumer: KafkaConsumer<RedisStore, idem::Json>,
    effects: &Effects,
    to: Option<String>,
) -> tokio::task::JoinHandle<()> {
    let handler = pipeline::hop::<KafkaMessage>(effects, to);
    tokio::spawn(async move {
        let _ = consumer.run(handler, std::future::pending()).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_hop_pipeline_applies_every_effect_once_and_loses_no_message() {
    let (a, b) = (Setup::new("pipe-a", 2).await, Setup::new("pipe-b", 2).await);
    let (at_a, at_b) = (Effects::default(), Effects::default());
    let producer = a.producer();
    for n in 0..INPUTS {
        let key = format!("order-{n}");
        for _duplicate in 0..2 {
            producer.send(&a.topic, Some(&key), "{}", None).await;
        }
    }

    // Phase 1: A applies inputs until its link hangs (a hung send blocks
    // its partition, as it would until the process is killed); then A's
    // process dies.
    let first = consumer(&a, FirstPhase::new(sender(&a))).await;
    let phase1 = spawn(first, &at_a, Some(b.topic.clone()));
    at_a.wait_for(REFUSED + 1, "A").await;
    pipeline::wait_completed(&a.store().await, &at_a).await;
    phase1.abort();
    let _ = phase1.await;

    // Phase 2: A again with a working link and a dispatcher, and B.
    let second = consumer(&a, sender(&a)).await;
    let dispatcher = second
        .consumer()
        .idempotency()
        .spawn_outbox_dispatcher(Duration::from_millis(200));
    let phase2 = spawn(second, &at_a, Some(b.topic.clone()));
    let hop_b = spawn(consumer(&b, sender(&b)).await, &at_b, None);
    at_b.wait_for(INPUTS, "B").await;
    // Late re-dispatches (a replay, the dispatcher) would show up here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    phase2.abort();
    hop_b.abort();
    drop(dispatcher);

    at_a.assert_each_once("A");
    at_b.assert_each_once("B");
}
