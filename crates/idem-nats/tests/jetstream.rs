//! The JetStream adapter against a real nats-server and a real Redis
//! store.
//!
//! The main case runs workers as separate processes of this test binary
//! and kills one with SIGKILL (by PID) in the middle of a handler; an
//! effects ledger on disk, written by the handlers, shows one effect per
//! message, none lost, and dead-letters only for the bad ones.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{consumer, stream};
use common::{publish, Setup};
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, Message, WindowError};
use idem_nats::{NatsConsumer, NatsError};
use idem_testkit::consumers::ledger::eventually;

idem_testkit::killed_worker_test!(Setup, "KILL");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_progress_acks_keep_a_long_handler_from_being_redelivered() {
    let setup = Setup::new("LONG");
    let js = setup.create_stream().await;
    let first = setup.nats().await;
    let second = setup.nats().await;
    publish(&js, &setup.subject(), Some("long-1"), r#"{"id":"long-1"}"#).await;
    let deliveries = Arc::new(AtomicU32::new(0));
    let handler = {
        let deliveries = Arc::clone(&deliveries);
        move |job: idem_consumer::Job<idem_nats::NatsMessage>| {
            let deliveries = Arc::clone(&deliveries);
            async move {
                deliveries.fetch_max(
                    job.message().delivery_count().unwrap_or(0),
                    Ordering::SeqCst,
                );
                // Four times the consumer's ack_wait of 1.5 s.
                tokio::time::sleep(Duration::from_secs(6)).await;
                Ok::<_, std::io::Error>(())
            }
        }
    };
    let stop = || {
        let stats = (first.consumer().clone(), second.consumer().clone());
        async move {
            eventually(Duration::from_secs(30), || {
                stats.0.stats().executed + stats.1.stats().executed == 1
            })
            .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (a, b) = tokio::join!(
        first.run(handler.clone(), stop()),
        second.run(handler, stop())
    );
    a.expect("first");
    b.expect("second");
    let (s1, s2) = (first.consumer().stats(), second.consumer().stats());
    assert_eq!(s1.executed + s2.executed, 1);
    assert_eq!(
        s1.in_flight_conflicts + s2.in_flight_conflicts,
        0,
        "JetStream never redelivered the message while its handler ran"
    );
    assert_eq!(deliveries.load(Ordering::SeqCst), 1, "delivered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_configurations_that_could_lose_or_rerun_messages() {
    let setup = Setup::new("CONFIG");
    let js = setup.create_stream().await;
    let consumer = |retention: Duration| async move {
        let idem = Idempotency::builder(setup_store(retention).await)
            .lease(Duration::from_secs(30))
            .heartbeat(Duration::from_secs(10))
            .retention(retention)
            .failure_retention(retention)
            .build()
            .expect("config");
        Consumer::builder(idem, Scope::new("orders").expect("scope")).build()
    };
    let url = setup.nats_url.clone();
    let day = Duration::from_secs(86_400);

    let short = NatsConsumer::builder(
        &url,
        &setup.stream,
        "c1",
        consumer(Duration::from_secs(1800)).await,
    )
    .connect()
    .await;
    match short {
        Err(NatsError::Window(error @ WindowError::RetentionTooShort { .. })) => {
            assert!(error.to_string().contains("max_age"), "{error}");
        }
        other => panic!("expected RetentionTooShort, got {:?}", other.err()),
    }

    let fast_ack = NatsConsumer::builder(&url, &setup.stream, "c2", consumer(day).await)
        .ack_wait(Duration::from_secs(5))
        .connect()
        .await;
    assert!(
        matches!(
            fast_ack,
            Err(NatsError::Window(WindowError::HeartbeatTooSlow { .. }))
        ),
        "{:?}",
        fast_ack.err()
    );

    let stream = js.get_stream(&setup.stream).await.expect("stream");
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("limited".to_owned()),
            max_deliver: 5,
            ack_wait: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .expect("create consumer");
    let limited = NatsConsumer::builder(&url, &setup.stream, "limited", consumer(day).await)
        .connect()
        .await;
    match limited {
        Err(NatsError::Config(why)) => assert!(why.contains("max_deliver 5"), "{why}"),
        other => panic!("expected Config, got {:?}", other.err()),
    }

    js.create_stream(stream::Config {
        name: format!("{}_FOREVER", setup.stream),
        subjects: vec![format!("{}_forever.>", setup.stream)],
        ..Default::default()
    })
    .await
    .expect("stream without max_age");
    let forever = format!("{}_FOREVER", setup.stream);
    let unbounded = NatsConsumer::builder(&url, &forever, "c3", consumer(day).await)
        .connect()
        .await;
    assert!(
        matches!(
            unbounded,
            Err(NatsError::Window(WindowError::Unbounded { .. }))
        ),
        "{:?}",
        unbounded.err()
    );
    NatsConsumer::builder(&url, &forever, "c3", consumer(day).await)
        .redelivery_window(Duration::from_secs(3600))
        .connect()
        .await
        .expect("a stated window retention covers starts");

    let missing = NatsConsumer::builder(&url, "NO_SUCH_STREAM", "c4", consumer(day).await)
        .connect()
        .await;
    match missing {
        Err(error @ NatsError::JetStream { .. }) => {
            assert!(
                error.to_string().contains("\"NO_SUCH_STREAM\" not found"),
                "{error}"
            );
        }
        other => panic!("expected JetStream, got {:?}", other.err()),
    }
}

async fn setup_store(_retention: Duration) -> idem_redis::RedisStore {
    idem_redis::RedisStore::builder(&common::redis().url())
        .expect("valid URL")
        .namespace(format!("config-{:016x}", rand::random::<u64>()))
        .connect()
        .await
        .expect("connect to redis")
}
