//! Faults between the consumer and the NATS server that it must survive
//! without stopping, losing a message or running one twice: the
//! connection cut (through a fault proxy) while messages are being
//! handled and acked, and the server killed (SIGKILL) and started again
//! on its JetStream store in the middle of the stream.

#[allow(dead_code)] // the rest serves tests/jetstream.rs
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use common::{publish, Setup};
use idem::Scope;
use idem_consumer::Consumer;
use idem_nats::NatsConsumer;
use idem_testkit::consumers::cuts;
use idem_testkit::servers::nats::NatsServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_mid_ack_is_reconnected_and_nothing_is_lost_or_run_twice() {
    let proxy = cuts::proxy(NatsServer::shared().expect("nats-server").port()).await;
    let setup = Setup::new("cut");
    let js = setup.create_stream().await;
    let idem = idem_testkit::consumers::scenario::executor(setup.store().await);
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
    let server = NatsServer::start().expect("nats-server");
    let setup = Setup {
        nats_url: server.url(),
        ..Setup::new("RESTART")
    };
    let js = setup.create_stream().await;
    let nats = setup.nats().await;
    for key in cuts::keys() {
        publish(&js, &setup.subject(), Some(&key), &cuts::payload(&key)).await;
    }
    let server = Arc::new(Mutex::new(server));
    let at_restart = Arc::new(AtomicUsize::new(0));
    nats.run(
        cuts::handler(setup.ledger.clone()),
        cuts::restart_mid_stream(
            setup.ledger.clone(),
            Arc::clone(&server),
            NatsServer::restart,
            Arc::clone(&at_restart),
        ),
    )
    .await
    .expect("the consumer outlives a server restart");
    cuts::assert_restarted(
        &setup.ledger,
        at_restart.load(Ordering::SeqCst),
        nats.consumer().stats().dead_letters,
    );
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
