//! Kinesis and DynamoDB Streams batches through a real Lambda runtime
//! loop, with DynamoDB on moto as the store: ordered sources, so the
//! first record that fails holds back the rest.

mod common;

use std::time::Duration;

use common::{counts, dynamodb_event, failures, kinesis_event, Function};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(3);

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
async fn dynamodb_stream_records_are_keyed_by_the_item_key_they_carry() {
    let f = Function::start("dynamodb").await;
    let first = dynamodb_event(&[("e1", "201", "a"), ("e2", "202", "b")]);
    let response = f.lambda.invoke(&first, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    // The same items again under new event ids (a replayed stream, a
    // table restored and written again): keyed by the item, not the event.
    let again = dynamodb_event(&[("e3", "203", "a"), ("e4", "204", "c")]);
    let response = f.lambda.invoke(&again, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    assert_eq!(f.effects(), counts([("a", 1), ("b", 1), ("c", 1)]));
}
