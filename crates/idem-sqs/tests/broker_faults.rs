//! Faults between the consumer and SQS that it must survive without
//! stopping, losing a message or running one twice: every connection to
//! SQS cut (through a fault proxy in front of moto) while messages are
//! being handled and deleted.

#[allow(dead_code)] // the rest serves tests/queues.rs
mod common;

use std::sync::Arc;

use common::Setup;
use idem_testkit::consumers::cuts;
use idem_testkit::servers::moto::MotoServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_mid_delete_are_made_again_and_nothing_is_lost_or_run_twice() {
    let moto =
        MotoServer::shared().expect("moto_server must be installed (scripts/test installs it)");
    let proxy = cuts::proxy(moto.port()).await;
    let setup = Setup::new("cut", false).await;
    let sqs = setup.sqs_at(&format!("http://{}", proxy.addr())).await;
    for key in cuts::keys() {
        setup.send(Some(&key), &cuts::payload(&key), None).await;
    }
    sqs.run(
        cuts::handler(setup.ledger.clone()),
        cuts::cut_three_times(setup.ledger.clone(), Arc::clone(&proxy)),
    )
    .await
    .expect("the consumer outlives cut connections");
    cuts::assert_survived(&setup.ledger, &proxy, sqs.consumer().stats().dead_letters);
    assert_eq!(
        setup.remaining().await,
        0,
        "nothing left behind in the queue"
    );
}
