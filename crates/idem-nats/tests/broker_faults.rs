//! Faults between the consumer and the NATS server that it must survive
//! without stopping, losing a message or running one twice: the
//! connection cut (through a fault proxy) while messages are being
//! handled and acked, and the server killed (SIGKILL) and started again
//! on its JetStream store in the middle of the stream.

#[allow(dead_code)] // the rest serves tests/jetstream.rs
mod common;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use common::{publish, Setup};
use idem::Scope;
use idem_consumer::Consumer;
use idem_nats::NatsConsumer;
use idem_testkit::cuts;
use idem_testkit::ledger::eventually;
use idem_testkit::nats::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_ack_is_reconnected_and_nothing_is_lost_or_run_twice() {
    let proxy = cuts::proxy(NatsServer::shared().expect("nats-server").port()).await;
    let setup = Setup::new("cut");
    let js = setup.create_stream().await;
    let idem = idem_testkit::scenario::executor(setup.store().await);
    let nats = NatsConsumer::builder(
        &format!("nats://{}", proxy.addr()),
        &setup.stream,
        "billing",
        Consumer::builder(idem, Scope::new("orders").expect("scope")).build(),
    )
    .concurrency(8)
    .ack_wait(Duration::from_millis(1500))
    .connect()
    .await
    .expect("connect to JetStream through the proxy");
    for key in cuts::keys() {
        publish(&js, &setup.subject(), Some(&key), &cuts::payload(&key)).await;
    }
    nats.run(
        cuts::handler(setup.ledger.clone()),
        cuts::cut_three_times(setup.ledger.clone(), Arc::clone(&proxy)),
    )
    .await
    .expect("the consumer outlives a cut connection");
    cuts::assert_survived(&setup.ledger, &proxy, nats.consumer().stats().dead_letters);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_restarted_mid_stream_is_reconnected_and_nothing_is_lost_or_run_twice()
{
    let mut server = NatsServer::start().expect("nats-server");
    let setup = Setup {
        nats_url: server.url(),
        ..Setup::new("RESTART")
    };
    let js = setup.create_stream().await;
    let nats = setup.nats().await;
    for key in cuts::keys() {
        publish(&js, &setup.subject(), Some(&key), &cuts::payload(&key)).await;
    }
    let ledger = setup.ledger.clone();
    let done = {
        let ledger = ledger.clone();
        async move {
            eventually(Duration::from_secs(60), || ledger.effects().len() >= 15).await;
            let at_restart = ledger.effects().len();
            let server = tokio::task::spawn_blocking(move || server.restart().map(|()| server))
                .await
                .expect("restart task")
                .expect("restart nats-server");
            eventually(Duration::from_secs(90), || {
                ledger.effects().len() == cuts::MESSAGES
            })
            .await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            (server, at_restart)
        }
    };
    let (server_tx, server_rx) = tokio::sync::oneshot::channel();
    nats.run(cuts::handler(ledger.clone()), async move {
        let _ = server_tx.send(done.await);
    })
    .await
    .expect("the consumer outlives a server restart");
    let (_server, at_restart) = server_rx.await.expect("the restart ran");
    assert!(
        at_restart < cuts::MESSAGES,
        "the server went down mid-stream ({at_restart} effects in)"
    );

    let effects = ledger.effects();
    assert_eq!(
        effects.len(),
        cuts::MESSAGES,
        "every message had its effect: {effects:?}"
    );
    assert!(
        effects.values().all(|n| *n == 1),
        "and only one: {effects:?}"
    );
    assert_eq!(nats.consumer().stats().dead_letters, 0);
    let js = async_nats::jetstream::new(
        async_nats::connect(setup.nats_url.as_str())
            .await
            .expect("connect"),
    );
    let info = js
        .get_stream(&setup.stream)
        .await
        .expect("stream")
        .get_consumer::<pull::Config>("billing")
        .await
        .expect("consumer")
        .info()
        .await
        .expect("consumer info")
        .clone();
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "every message was settled"
    );
}
