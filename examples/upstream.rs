//! A stand-in for your service behind `idem proxy`: `POST /charges` "charges
//! a card" (it counts each charge and answers 201 with the charge), and
//! `GET /charges/count` says how many charges really ran. It knows nothing
//! of idempotency; the gateway in front of it does.
//!
//! Run: `cargo run -p idem-examples --example upstream -- 127.0.0.1:3000`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::Router;

async fn charge(
    State(charges): State<Arc<AtomicU64>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    // A slow payment provider: duplicates arriving meanwhile get 409.
    if let Some(ms) = headers
        .get("x-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(
            r#"{{"charge_id":"ch_{n}","request":{}}}"#,
            String::from_utf8_lossy(&body)
        ),
    )
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let charges = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route("/charges", post(charge))
        .route(
            "/charges/count",
            get(|State(c): State<Arc<AtomicU64>>| async move {
                format!("{}\n", c.load(Ordering::SeqCst))
            }),
        )
        .with_state(charges);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!("upstream listening on {listen}");
    axum::serve(listener, app).await
}
