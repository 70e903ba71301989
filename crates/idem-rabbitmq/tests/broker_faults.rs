//! Faults between the consumer and RabbitMQ that it must survive without
//! stopping, losing a message or running one twice:
//!
//! - the broker's `consumer_timeout`: a delivery left unacknowledged
//!   longer makes the broker close the consuming channel and requeue
//!   everything that channel held (on a broker of the test's own, with a
//!   2 s timeout; the machine's keeps RabbitMQ's 30 minutes);
//! - the connection cut (through a fault proxy) while deliveries are being
//!   handled and acked;
//! - the broker restarted (stopped cleanly and started again on the same
//!   data) in the middle of the stream.
//!
//! Each runs on classic queues and again on quorum queues.

#[allow(dead_code)] // the rest serves tests/rabbitmq.rs
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{drain, publish, publisher, publisher_at, Setup};
use idem_consumer::Job;
use idem_rabbitmq::AmqpMessage;
use idem_testkit::consumers::cuts;
use idem_testkit::consumers::ledger::eventually;
use idem_testkit::servers::rabbitmq::{RabbitOptions, RabbitServer};

const SLOW: &str = "t-3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_the_broker_closes_under_a_slow_handler_is_reopened_and_nothing_is_lost_or_run_twice(
) {
    channel_closed_under_a_slow_handler(Setup::new("timeout")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_quorum_queues_a_channel_closed_under_a_slow_handler_is_reopened_and_nothing_is_lost_or_run_twice(
) {
    channel_closed_under_a_slow_handler(Setup::new("timeout-quorum").on_quorum_queues()).await;
}

async fn channel_closed_under_a_slow_handler(setup: Setup) {
    let server = RabbitServer::start_with(&RabbitOptions {
        consumer_timeout: Some(Duration::from_secs(2)),
    })
    .expect("start a RabbitMQ broker");
    let rabbit = setup.rabbit_at(server.url()).await;
    let (_connection, channel) = publisher_at(server.url()).await;
    let keys: Vec<String> = (0..12).map(|i| format!("t-{i}")).collect();
    for key in &keys {
        publish(&channel, &setup.queue, Some(key), &cuts::payload(key)).await;
    }

    let ledger = setup.ledger.clone();
    let handler = {
        let ledger = ledger.clone();
        move |job: Job<AmqpMessage>| {
            let ledger = ledger.clone();
            async move {
                let key = job.key().as_str().to_owned();
                ledger.start(&key);
                if key == SLOW {
                    // Well past the broker's consumer_timeout, with the
                    // claim kept alive by heartbeats all along.
                    tokio::time::sleep(Duration::from_secs(6)).await;
                }
                job.ctx().ensure_lease()?;
                ledger.effect(&key);
                Ok::<_, idem::LeaseLost>(())
            }
        }
    };
    let done = {
        let ledger = ledger.clone();
        async move {
            eventually(Duration::from_secs(60), || {
                ledger.effects().len() == keys.len()
            })
            .await;
            // Let the redelivered copies of the slow one meet its stored
            // outcome and settle.
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    };
    rabbit
        .run(handler, done)
        .await
        .expect("the consumer outlives a channel the broker closed");

    let effects = ledger.effects();
    assert_eq!(
        effects.len(),
        12,
        "every message had its effect: {effects:?}"
    );
    assert!(
        effects.values().all(|n| *n == 1),
        "and only one: {effects:?}"
    );
    assert!(
        ledger.started()[SLOW] == 1,
        "the redelivered slow message met its live claim and was not run again: {:?}",
        ledger.started()
    );
    let stats = rabbit.consumer().stats();
    assert!(
        stats.in_flight_conflicts + stats.replayed >= 1,
        "the broker did redeliver the slow message while it ran: {stats:?}"
    );
    assert_eq!(stats.dead_letters, 0, "{stats:?}");
    assert!(
        drain(&channel, &setup.queue).await.is_empty(),
        "nothing left behind in the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_ack_is_opened_again_and_nothing_is_lost_or_run_twice() {
    connection_cut_mid_ack(Setup::new("cut")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_quorum_queues_a_connection_cut_mid_ack_is_opened_again_and_nothing_is_lost_or_run_twice(
) {
    connection_cut_mid_ack(Setup::new("cut-quorum").on_quorum_queues()).await;
}

async fn connection_cut_mid_ack(setup: Setup) {
    let proxy = cuts::proxy(RabbitServer::shared().expect("RabbitMQ broker").port()).await;
    let rabbit = setup
        .rabbit_at(&format!("amqp://guest:guest@{}/%2f", proxy.addr()))
        .await;
    let (_connection, channel) = publisher().await;
    for key in cuts::keys() {
        publish(&channel, &setup.queue, Some(&key), &cuts::payload(&key)).await;
    }
    rabbit
        .run(
            cuts::handler(setup.ledger.clone()),
            cuts::cut_three_times(setup.ledger.clone(), Arc::clone(&proxy)),
        )
        .await
        .expect("the consumer outlives a cut connection");
    cuts::assert_survived(
        &setup.ledger,
        &proxy,
        rabbit.consumer().stats().dead_letters,
    );
    assert!(
        drain(&channel, &setup.queue).await.is_empty(),
        "nothing left behind in the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restarted_mid_stream_is_reconnected_and_nothing_is_lost_or_run_twice() {
    broker_restarted_mid_stream(Setup::new("restart")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_quorum_queues_a_broker_restarted_mid_stream_is_reconnected_and_nothing_is_lost_or_run_twice(
) {
    broker_restarted_mid_stream(Setup::new("restart-quorum").on_quorum_queues()).await;
}

async fn broker_restarted_mid_stream(setup: Setup) {
    let server =
        RabbitServer::start_with(&RabbitOptions::default()).expect("start a RabbitMQ broker");
    let rabbit = setup.rabbit_at(server.url()).await;
    {
        let (_connection, channel) = publisher_at(server.url()).await;
        for key in cuts::keys() {
            publish(&channel, &setup.queue, Some(&key), &cuts::payload(&key)).await;
        }
    }
    let url = server.url().to_owned();
    let server = Arc::new(Mutex::new(server));
    let at_restart = Arc::new(AtomicUsize::new(0));
    rabbit
        .run(
            cuts::handler(setup.ledger.clone()),
            cuts::restart_mid_stream(
                setup.ledger.clone(),
                Arc::clone(&server),
                RabbitServer::restart,
                Arc::clone(&at_restart),
            ),
        )
        .await
        .expect("the consumer outlives a broker restart");
    cuts::assert_restarted(
        &setup.ledger,
        at_restart.load(Ordering::SeqCst),
        rabbit.consumer().stats().dead_letters,
    );
    let (_connection, channel) = publisher_at(&url).await;
    assert!(
        drain(&channel, &setup.queue).await.is_empty(),
        "nothing left behind in the queue"
    );
}
