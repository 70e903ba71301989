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
    let args = [
        gw.url.clone(),
        orders.to_string(),
        "0.5".into(),
        "10".into(),
    ];
    let answers = run_sdk_script("stripe_orders.py", &args).await;
    let charges = payments.charges.lock().expect("lock").clone();
    assert_eq!(answers.len(), orders, "{answers:?}");
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
