//! Signed webhooks through the gateway (`--webhook`), signed by the
//! senders' own libraries (`tests/sdk/webhook_sender.py`: the Standard
//! Webhooks library, the Stripe SDK's signing helper): concurrent copies
//! and a later re-signed retry of each event reach the receiver once, and
//! a copy signed with the wrong secret, or not signed, is refused without
//! using the key, so the sender's own delivery of that event still runs.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use common::*;
use idem_http::{Webhook, WebhookKind};
use tokio::net::TcpListener;

/// Deliveries the receiver handled, by event id.
type Handled = Arc<Mutex<HashMap<String, u32>>>;

/// `POST /hooks`: handles an event (slowly, so copies overlap) and says
/// which delivery of it this was.
async fn receive(State(handled): State<Handled>, headers: HeaderMap, body: Bytes) -> String {
    let event: serde_json::Value = serde_json::from_slice(&body).expect("a JSON event");
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| event["id"].as_str().map(str::to_owned))
        .expect("an event id");
    let n = {
        let mut handled = handled.lock().expect("lock");
        let n = handled.entry(id.clone()).or_default();
        *n += 1;
        *n
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    format!("{id} handled {n}")
}

async fn deliver(kind: WebhookKind, name: &str, secret: &str) {
    let handled = Handled::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = listener.local_addr().expect("addr");
    let app = Router::new()
        .route("/hooks", post(receive))
        .with_state(Arc::clone(&handled));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().expect("dir");
    let mut cfg = config(upstream);
    cfg.webhook = Some(Webhook::new(kind, secret).expect("secret"));
    let gw = Gateway::start(sqlite(&dir), cfg).await;

    let (events, copies) = (3, 4);
    let args = [
        format!("{}/hooks", gw.url),
        name.to_owned(),
        secret.to_owned(),
        events.to_string(),
        copies.to_string(),
    ];
    let results = run_sdk_script("webhook_sender.py", &args).await;
    let of = |event: &str, try_: &str| -> Vec<&serde_json::Value> {
        results
            .iter()
            .filter(|r| r["event"] == event && r["try"] == try_)
            .collect()
    };

    for n in 0..events {
        let event = format!("evt_{n}");
        let first = format!("{event} handled 1");
        let copies_ = of(&event, "copy");
        assert_eq!(copies_.len(), copies);
        for copy in &copies_ {
            // A copy arriving while the first runs is told to retry.
            assert!(copy["status"] == 200 || copy["status"] == 409, "{copy}");
            if copy["status"] == 200 {
                assert_eq!(copy["body"], first.as_str(), "{copy}");
            }
        }
        for try_ in ["resigned", "rekeyed"] {
            let again = of(&event, try_);
            assert_eq!(again[0]["status"], 200, "{}", again[0]);
            assert_eq!(again[0]["replayed"], true, "{}", again[0]);
            assert_eq!(again[0]["body"], first.as_str());
        }
    }
    for try_ in ["forged", "unsigned"] {
        let refused = of("evt_forged", try_);
        assert_eq!(refused[0]["status"], 400, "{}", refused[0]);
        let body = refused[0]["body"].as_str().expect("body");
        assert!(body.contains("bad-signature"), "{body}");
    }
    let signed = of("evt_forged", "signed");
    assert_eq!(signed[0]["status"], 200, "{}", signed[0]);
    assert_eq!(
        signed[0]["replayed"], false,
        "the refused copies used no key"
    );
    assert_eq!(signed[0]["body"], "evt_forged handled 1");

    let handled = handled.lock().expect("lock").clone();
    assert_eq!(handled.len(), events + 1, "{handled:?}");
    assert!(
        handled.values().all(|&n| n == 1),
        "one effect per event: {handled:?}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_signed_by_their_library_have_one_effect_per_event() {
    deliver(
        WebhookKind::Standard,
        "standard",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_events_signed_by_the_stripe_sdk_have_one_effect_per_event() {
    deliver(
        WebhookKind::Stripe,
        "stripe",
        "whsec_idem_test_endpoint_secret",
    )
    .await;
}
