//! An off-the-shelf API SDK through the gateway: the official Stripe Python
//! SDK (installed by `scripts/test` into a virtual environment), with its
//! own retry policy, charging orders through `idem proxy` in front of a
//! payment service slower than the SDK's timeout. The SDK times out,
//! reconnects and retries with the same key, gets 409s while the charge
//! runs and then the stored answer: each order is charged once, and the
//! SDK returns that one charge.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use common::*;
use tokio::net::TcpListener;

/// Charges per order, and the ids handed out.
#[derive(Clone, Default)]
struct Payments {
    charges: Arc<Mutex<HashMap<String, Vec<String>>>>,
}

/// `POST /v1/charges`: charges at once, answers after `delay`, as a
/// payment provider that is slow to confirm.
async fn charge(State((payments, delay)): State<(Payments, Duration)>, body: Bytes) -> String {
    let form = String::from_utf8_lossy(&body);
    let order = form
        .split('&')
        .find_map(|pair| pair.strip_prefix("description="))
        .unwrap_or("none")
        .to_owned();
    let id = {
        let mut charges = payments.charges.lock().expect("lock");
        let total: usize = charges.values().map(Vec::len).sum();
        let id = format!("ch_{}", total + 1);
        charges.entry(order.clone()).or_default().push(id.clone());
        id
    };
    tokio::time::sleep(delay).await;
    serde_json::json!({
        "id": id,
        "object": "charge",
        "amount": 1250,
        "currency": "eur",
        "description": order,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stripe_sdk_retrying_through_the_gateway_charges_each_order_once() {
    let payments = Payments::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .with_state((payments.clone(), Duration::from_secs(2)));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = config(upstream);
    cfg.lease = Duration::from_secs(3);
    let gw = Gateway::start(sqlite(&dir), cfg).await;

    let orders = 3;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/stripe_orders.py");
    let output = tokio::process::Command::new(sdk_python())
        .arg(script)
        .arg(&gw.url)
        .arg(orders.to_string())
        .arg("0.5")
        .arg("10")
        .env("NO_PROXY", "*")
        .output()
        .await
        .expect("run the SDK");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "SDK script failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let charges = payments.charges.lock().expect("lock").clone();
    let answers: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(answers.len(), orders, "{stdout}");
    for answer in &answers {
        let order = format!("order-{}", answer["order"]);
        let made = charges.get(&order).cloned().unwrap_or_default();
        assert_eq!(
            made.len(),
            1,
            "{order} was charged {made:?}; SDK said {answer}"
        );
        assert_eq!(
            answer["charge"], made[0],
            "the SDK got the one charge that was made: {answer}"
        );
    }
    gw.shutdown().await;
}
