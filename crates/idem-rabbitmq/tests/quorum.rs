//! Quorum queues (`x-queue-type: quorum`, RabbitMQ 4's default type) on a
//! real broker: the consumer declares its topology as quorum queues, runs
//! duplicates once (also with a worker process killed mid-handler: the
//! scenario of `tests/rabbitmq.rs`), and dead-letters the broker's last
//! delivery of a message (its `x-delivery-limit`) with the reason instead
//! of running it.

#[allow(dead_code)] // the rest serves tests/rabbitmq.rs
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{drain, publish, publisher, text, Setup};
use futures_util::StreamExt as _;
use idem::Scope;
use idem_consumer::{Consumer, Job, REASON_HEADER};
use idem_rabbitmq::{AmqpMessage, RabbitConsumer, RabbitError, KEY_HEADER};
use idem_testkit::consumers::ledger::eventually;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;

idem_testkit::killed_worker_test!(common::Quorum, "kill-quorum");

/// A consumer of `setup`'s queue declared as a quorum queue with this
/// delivery limit.
async fn quorum(setup: &Setup, limit: u32) -> RabbitConsumer<idem_redis::RedisStore, idem::Json> {
    let idem = idem_testkit::consumers::scenario::executor(setup.store().await);
    let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope")).build();
    RabbitConsumer::builder(common::amqp(), &setup.queue, consumer)
        .quorum()
        .delivery_limit(limit)
        .retry_delays([Duration::from_millis(200)])
        .message_ttl(Duration::from_secs(3600))
        .connect()
        .await
        .expect("a quorum queue starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_runs_duplicates_once_and_dead_letters_its_last_delivery_with_the_reason() {
    let setup = Setup::new("quorum");
    let rabbit = quorum(&setup, 1).await;
    let (_connection, channel) = publisher().await;

    // q-1 is taken by a consumer that dies without acking it: the broker
    // returns it, and its next delivery (the second, with a delivery
    // limit of 1) is its last.
    publish(&channel, &setup.queue, Some("q-1"), r#"{"id":"q-1"}"#).await;
    {
        let (connection, dying) = publisher().await;
        dying
            .basic_qos(1, BasicQosOptions::default())
            .await
            .expect("qos");
        let mut deliveries = dying
            .basic_consume(
                setup.queue.as_str().into(),
                "dying".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        tokio::time::timeout(Duration::from_secs(10), deliveries.next())
            .await
            .expect("q-1 delivered")
            .expect("a delivery")
            .expect("no error");
        connection.close(0, "dies".into()).await.expect("close");
    }
    for key in ["q-2", "q-2", "q-3"] {
        publish(
            &channel,
            &setup.queue,
            Some(key),
            &format!(r#"{{"id":"{key}"}}"#),
        )
        .await;
    }

    let ran = Arc::new(Mutex::new(Vec::<String>::new()));
    let handler = {
        let ran = Arc::clone(&ran);
        move |job: Job<AmqpMessage>| {
            ran.lock()
                .expect("lock")
                .push(job.key().as_str().to_owned());
            async { Ok::<_, idem::Terminal>(()) }
        }
    };
    let stop = {
        let rabbit_stats = rabbit.consumer().clone();
        async move {
            eventually(Duration::from_secs(30), || {
                let stats = rabbit_stats.stats();
                stats.executed + stats.replayed + stats.dead_letters >= 4
            })
            .await;
        }
    };
    rabbit.run(handler, stop).await.expect("a clean stop");

    let mut ran = ran.lock().expect("lock").clone();
    ran.sort();
    assert_eq!(ran, ["q-2", "q-3"], "q-1's last delivery did not run");
    let stats = rabbit.consumer().stats();
    assert_eq!(
        (stats.executed, stats.replayed, stats.dead_letters),
        (2, 1, 1),
        "{stats:?}"
    );
    let dead = drain(&channel, &format!("{}.dead", setup.queue)).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (_, headers) = &dead[0];
    assert_eq!(text(headers, KEY_HEADER), Some("q-1"));
    let reason = text(headers, REASON_HEADER).expect("a reason");
    assert!(reason.contains("delivery 2 is the last"), "{reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_declared_as_classic_is_refused_and_a_limit_needs_quorum() {
    let setup = Setup::new("quorum-config");
    drop(quorum(&setup, 5).await);
    let idem = idem_testkit::consumers::scenario::executor(setup.store().await);
    let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope")).build();
    let classic = RabbitConsumer::builder(common::amqp(), &setup.queue, consumer.clone())
        .message_ttl(Duration::from_secs(3600))
        .connect()
        .await;
    match classic {
        Err(error @ RabbitError::Declare { .. }) => {
            let text = format!("{error}: {:?}", std::error::Error::source(&error));
            assert!(text.contains("x-queue-type"), "{text}");
        }
        other => panic!("expected Declare, got {:?}", other.err()),
    }
    let limited_classic = RabbitConsumer::builder(common::amqp(), &setup.queue, consumer)
        .delivery_limit(5)
        .message_ttl(Duration::from_secs(3600))
        .connect()
        .await;
    match limited_classic {
        Err(error @ RabbitError::Config(_)) => {
            assert!(error.to_string().contains("quorum()"), "{error}");
        }
        other => panic!("expected Config, got {:?}", other.err()),
    }
}
