//! SQS batches through a real Lambda runtime loop (the Runtime API served
//! by the test kit, the function its own process), with DynamoDB on moto
//! as the store.

mod common;

use std::time::Instant;

use common::{counts, failures, sqs_event, Function, TIMEOUT};
use serde_json::json;

#[test]
#[ignore = "the function's process, started by the tests"]
fn function() {
    common::function_main();
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicates_in_one_batch_and_across_batches_take_effect_once() {
    let f = Function::start("sqs").await;
    let first = sqs_event(
        "orders",
        &[
            ("m1", json!({"id": "a"})),
            ("m2", json!({"id": "a"})),
            ("m3", json!({"id": "b"})),
        ],
    );
    let response = f.lambda.invoke(&first, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    assert_eq!(f.effects(), counts([("a", 1), ("b", 1)]));

    let second = sqs_event(
        "orders",
        &[
            ("m4", json!({"id": "b"})),
            ("m5", json!({"id": "c"})),
            ("m1", json!({"id": "a"})),
        ],
    );
    let response = f.lambda.invoke(&second, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    assert_eq!(f.effects(), counts([("a", 1), ("b", 1), ("c", 1)]));
    assert_eq!(f.starts(), counts([("a", 1), ("b", 1), ("c", 1)]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_record_is_reported_and_never_run_again() {
    let f = Function::start("sqs").await;
    let batch = sqs_event(
        "orders",
        &[
            ("m1", json!({"id": "p", "poison": true})),
            ("m2", json!({"id": "d"})),
            ("m3", json!({"no id": true})),
        ],
    );
    for _ in 0..2 {
        let response = f.lambda.invoke(&batch, TIMEOUT).await.json();
        assert_eq!(failures(&response), ["m1", "m3"]);
    }
    assert_eq!(f.starts(), counts([("d", 1), ("p", 1)]));
    assert_eq!(f.effects(), counts([("d", 1)]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_out_of_time_is_released_and_runs_at_once_when_delivered_again() {
    let f = Function::start("sqs").await;
    let batch = sqs_event(
        "orders",
        &[
            ("m1", json!({"id": "slow", "sleep_ms": 60_000})),
            ("m2", json!({"id": "next"})),
        ],
    );
    let response = f.lambda.invoke(&batch, TIMEOUT).await.json();
    assert_eq!(
        failures(&response),
        ["m1", "m2"],
        "answered before the deadline"
    );
    assert_eq!(f.effects(), counts([]));

    // The claim was released, not left to its 30 s lease: the redelivery
    // runs now.
    let started = Instant::now();
    let response = f.lambda.invoke(&batch, TIMEOUT).await.json();
    assert_eq!(failures(&response), Vec::<String>::new());
    assert!(started.elapsed() < TIMEOUT);
    assert_eq!(f.effects(), counts([("next", 1), ("slow", 1)]));
    assert_eq!(f.starts(), counts([("next", 1), ("slow", 2)]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fifo_batch_stops_at_its_first_failure() {
    let f = Function::start("sqs").await;
    let batch = sqs_event(
        "orders.fifo",
        &[
            ("m1", json!({"id": "f1"})),
            ("m2", json!({"id": "f2", "poison": true})),
            ("m3", json!({"id": "f3"})),
        ],
    );
    let response = f.lambda.invoke(&batch, TIMEOUT).await.json();
    assert_eq!(failures(&response), ["m2", "m3"]);
    assert_eq!(f.starts(), counts([("f1", 1), ("f2", 1)]));
    assert_eq!(f.effects(), counts([("f1", 1)]));
}
