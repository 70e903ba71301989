//! Kinesis and DynamoDB Streams batches through a real Lambda runtime
//! loop, with DynamoDB on moto as the store: ordered sources, so the
//! first record that fails holds back the rest.

mod common;

use std::time::Duration;

use common::{counts, dynamodb_event, failures, kinesis_event, Function, TIMEOUT};
use idem_testkit::servers::lambda::Invoked;
use serde_json::json;

#[test]
#[ignore = "the function's process, started by the tests"]
fn function() {
    common::function_main();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kinesis_batch_is_reported_from_its_first_failure_and_retried_from_there() {
    let f = Function::start("kinesis").await;
    let batch = kinesis_event(&[
        ("101", json!({"id": "k1"})),
        ("102", json!({"id": "k2", "sleep_ms": 60_000})),
        ("103", json!({"id": "k3"})),
    ]);
    let response = f.lambda.invoke(&batch, TIMEOUT).await.json();
    assert_eq!(failures(&response), ["102", "103"]);
    assert_eq!(f.effects(), counts([("k1", 1)]));

    // Lambda retries the whole batch (a stream retries from the first
    // failure, but a retry of everything is what a bisected or restarted
    // shard can send): k1 replays, k2 and k3 run.
    let response = f.lambda.invoke(&batch, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    assert_eq!(f.effects(), counts([("k1", 1), ("k2", 1), ("k3", 1)]));
    assert_eq!(f.starts(), counts([("k1", 1), ("k2", 2), ("k3", 1)]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_left_by_a_killed_function_is_waited_for_not_retried_at_once() {
    let f = Function::with_lease("kinesis", Duration::from_secs(4)).await;
    let batch = kinesis_event(&[
        ("301", json!({"id": "j1"})),
        ("302", json!({"id": "j2", "block_ms": 60_000})),
        ("303", json!({"id": "j3"})),
    ]);
    // j2 blocks its thread past the deadline: Lambda kills the function
    // with j2's claim held.
    let killed = f.lambda.function_pid();
    assert_eq!(f.lambda.invoke(&batch, TIMEOUT).await, Invoked::TimedOut);
    assert_ne!(f.lambda.function_pid(), killed, "started again");
    assert_eq!(f.effects(), counts([("j1", 1)]));

    // The retry waits for j2's lease to run out, takes it over and goes
    // on, instead of naming j2 at once for Lambda to retry the shard.
    let response = f.lambda.invoke(&batch, Duration::from_secs(6)).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    assert_eq!(f.effects(), counts([("j1", 1), ("j2", 1), ("j3", 1)]));
    assert_eq!(f.starts(), counts([("j1", 1), ("j2", 2), ("j3", 1)]));
}

#[tokio::test(flavor = "multi_thread")]
async fn dynamodb_stream_records_are_keyed_by_the_change_they_carry() {
    let f = Function::start("dynamodb").await;
    let first = dynamodb_event(&[("e1", "201", "a"), ("e2", "202", "b")]);
    let response = f.lambda.invoke(&first, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    // Lambda delivers the batch again: replayed.
    let response = f.lambda.invoke(&first, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    // A new change to item a is a change of its own: it runs.
    let next = dynamodb_event(&[("e3", "203", "a")]);
    let response = f.lambda.invoke(&next, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    assert_eq!(f.effects(), counts([("e1", 1), ("e2", 1), ("e3", 1)]));
}
