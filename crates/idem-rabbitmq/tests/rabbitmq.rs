//! The RabbitMQ adapter against a real broker and a real Redis store.
//!
//! The main case runs workers as separate processes of this test binary
//! and kills one with SIGKILL (by PID) in the middle of a handler; an
//! effects ledger on disk, written by the handlers, shows one effect per
//! message, none lost, and dead-letters only for the poison message.

mod common;

use std::time::Duration;

use common::{publish, publisher, Setup};
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, WindowError};
use idem_rabbitmq::{RabbitConsumer, RabbitError};
use idem_testkit::consumers::ledger::{eventually, order_handler};

idem_testkit::killed_worker_test!(Setup, "kill");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_settles_what_is_in_flight_and_loses_nothing() {
    let setup = Setup::new("shutdown");
    let rabbit = setup.rabbit().await;
    let (_connection, channel) = publisher().await;
    let keys: Vec<String> = (0..40).map(|i| format!("s-{i}")).collect();
    for key in &keys {
        publish(
            &channel,
            &setup.queue,
            Some(key),
            &format!(r#"{{"id":"{key}"}}"#),
        )
        .await;
    }
    // Stop after a few effects, in the middle of the stream.
    let ledger = setup.ledger.clone();
    let stop = {
        let ledger = ledger.clone();
        async move {
            eventually(Duration::from_secs(30), || ledger.effects().len() >= 5).await;
        }
    };
    let handler_ledger = ledger.clone();
    let paced = move |job| {
        let ledger = handler_ledger.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            order_handler(job, ledger, None).await
        }
    };
    rabbit.run(paced, stop).await.expect("clean stop");
    drop(rabbit);
    let first = ledger.effects();
    assert!(
        first.len() >= 5 && first.len() < 40,
        "stopped mid-stream: {}",
        first.len()
    );
    assert_eq!(
        ledger.started().keys().collect::<Vec<_>>(),
        first.keys().collect::<Vec<_>>(),
        "every handler that started before the stop was let finish"
    );

    let again = setup.rabbit().await;
    let all = {
        let ledger = ledger.clone();
        async move {
            eventually(Duration::from_secs(30), || ledger.effects().len() == 40).await;
        }
    };
    let handler_ledger = ledger.clone();
    again
        .run(
            move |job| order_handler(job, handler_ledger.clone(), None),
            all,
        )
        .await
        .expect("second run");
    let ledger = ledger.effects();
    for key in &keys {
        assert_eq!(ledger.get(key), Some(&1), "exactly one effect for {key}");
    }
    assert_eq!(again.consumer().stats().dead_letters, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_a_window_retention_cannot_cover_and_a_queue_declared_otherwise() {
    let setup = Setup::new("config");
    let idem = Idempotency::builder(setup.store().await)
        .retention(Duration::from_secs(3600))
        .build()
        .expect("config");
    let consumer = Consumer::builder(idem, Scope::new("orders").expect("scope")).build();
    let unbounded = RabbitConsumer::builder(common::amqp(), &setup.queue, consumer.clone())
        .connect()
        .await;
    assert!(
        matches!(
            unbounded,
            Err(RabbitError::Window(WindowError::Unbounded { .. }))
        ),
        "a queue without TTL or stated window is refused"
    );
    let too_long = RabbitConsumer::builder(common::amqp(), &setup.queue, consumer.clone())
        .message_ttl(Duration::from_secs(2 * 3600))
        .connect()
        .await;
    match too_long {
        Err(RabbitError::Window(error @ WindowError::RetentionTooShort { .. })) => {
            assert!(error.to_string().contains("message TTL"), "{error}");
        }
        other => panic!("expected RetentionTooShort, got {:?}", other.err()),
    }
    RabbitConsumer::builder(common::amqp(), &setup.queue, consumer.clone())
        .message_ttl(Duration::from_secs(600))
        .connect()
        .await
        .expect("a covered window starts");
    let redeclared = RabbitConsumer::builder(common::amqp(), &setup.queue, consumer)
        .message_ttl(Duration::from_secs(300))
        .connect()
        .await;
    match redeclared {
        Err(error @ RabbitError::Declare { .. }) => {
            let text = format!("{error}: {:?}", std::error::Error::source(&error));
            assert!(text.contains("x-message-ttl"), "{text}");
        }
        other => panic!("expected Declare, got {:?}", other.err()),
    }
    let nowhere = RabbitConsumer::builder(
        "amqp://guest:secret@127.0.0.1:1/%2f",
        &setup.queue,
        Consumer::builder(
            Idempotency::builder(setup.store().await)
                .build()
                .expect("config"),
            Scope::new("orders").expect("scope"),
        )
        .build(),
    )
    .message_ttl(Duration::from_secs(60))
    .connect()
    .await;
    match nowhere {
        Err(error @ RabbitError::Connect { .. }) => {
            let text = error.to_string();
            assert!(!text.contains("secret"), "password masked: {text}");
            assert!(text.contains("127.0.0.1:1"), "{text}");
        }
        other => panic!("expected Connect, got {:?}", other.err()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_of_the_same_consumer_at_once_is_refused() {
    let setup = Setup::new("twice");
    let rabbit = std::sync::Arc::new(setup.rabbit().await);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn({
        let rabbit = std::sync::Arc::clone(&rabbit);
        async move {
            rabbit
                .run(|_job| async { Ok::<_, std::io::Error>(()) }, async {
                    stopped.await.ok();
                })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = rabbit
        .run(
            |_job| async { Ok::<_, std::io::Error>(()) },
            std::future::pending(),
        )
        .await;
    match second {
        Err(error @ RabbitError::Config(_)) => {
            assert!(error.to_string().contains("already running"), "{error}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    stop.send(()).expect("the first run waits");
    first
        .await
        .expect("task")
        .expect("the first run stops cleanly");
    rabbit
        .run(|_job| async { Ok::<_, std::io::Error>(()) }, async {})
        .await
        .expect("a run after the first ended is allowed");
}
