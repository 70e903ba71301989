//! `idem proxy --reconcile URL`: the gateway binary asks the upstream's
//! reconcile endpoint about keys whose outcome is unknown (a response
//! lost to the upstream timeout) and settles them on its answer, over the
//! embedded SQLite store.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use common::process::GatewayProcess;
use common::{client, problem};

/// The upstream's ledger: how often each key was sent and charged, and the
/// questions its reconcile endpoint was asked (key, method, path).
#[derive(Clone, Default)]
struct Ledger {
    calls: Arc<Mutex<HashMap<String, u32>>>,
    charges: Arc<Mutex<HashMap<String, u32>>>,
    asked: Arc<Mutex<Vec<(String, String, String)>>>,
}

fn key(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// `POST /charges`: keys starting `slow-` are charged and then answered
/// too late for the gateway; `dropped-` ones are given up before they
/// are charged, also too late; others are charged and answered at once.
async fn charge(State(ledger): State<Ledger>, headers: HeaderMap) -> impl IntoResponse {
    let key = key(&headers);
    let first = {
        let mut calls = ledger.calls.lock().expect("lock");
        let n = calls.entry(key.clone()).or_default();
        *n += 1;
        *n == 1
    };
    if first && key.starts_with("dropped-") {
        tokio::time::sleep(Duration::from_secs(3)).await;
        return (StatusCode::SERVICE_UNAVAILABLE, "gave up".to_owned());
    }
    let n = {
        let mut charges = ledger.charges.lock().expect("lock");
        let n = charges.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    if first && key.starts_with("slow-") {
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    (StatusCode::CREATED, format!("charged {key} ({n})"))
}

/// `GET /reconcile`: applied (with the charge's response) when the key
/// was charged, not applied when not, and no finding for `-unsure-` keys.
async fn reconcile(State(ledger): State<Ledger>, headers: HeaderMap) -> impl IntoResponse {
    let key = key(&headers);
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    ledger.asked.lock().expect("lock").push((
        key.clone(),
        header("idem-method"),
        header("idem-path"),
    ));
    if key.contains("-unsure-") {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            HeaderMap::new(),
            String::new(),
        );
    }
    let charged = ledger.charges.lock().expect("lock").get(&key).copied();
    let mut out = HeaderMap::new();
    match charged {
        Some(n) => {
            out.insert("idempotency-outcome", "applied".parse().expect("value"));
            (StatusCode::CREATED, out, format!("charged {key} ({n})"))
        }
        None => {
            out.insert("idempotency-outcome", "not-applied".parse().expect("value"));
            (StatusCode::NOT_FOUND, out, String::new())
        }
    }
}

async fn start_upstream() -> (Ledger, std::net::SocketAddr) {
    let ledger = Ledger::default();
    let app = Router::new()
        .route("/charges", post(charge))
        .route("/reconcile", get(reconcile))
        .with_state(ledger.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (ledger, addr)
}

async fn gateway(upstream: std::net::SocketAddr, db: &std::path::Path) -> GatewayProcess {
    let upstream = format!("http://{upstream}");
    let reconcile = format!("{upstream}/reconcile");
    GatewayProcess::start(
        &format!("sqlite:{}", db.display()),
        &[
            "--upstream",
            &upstream,
            "--upstream-timeout",
            "1s",
            "--reconcile",
            &reconcile,
            "--reconcile-every",
            "0",
        ],
    )
    .await
}

async fn post_charge(gateway: &GatewayProcess, key: &str) -> reqwest::Response {
    client()
        .post(format!("{}/charges?currency=eur", gateway.url))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"amount":100}"#)
        .send()
        .await
        .expect("answered")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_settles_lost_responses_by_asking_the_upstream() {
    let dir = tempfile::tempdir().expect("dir");
    let (ledger, upstream) = start_upstream().await;
    let gw = gateway(upstream, &dir.path().join("idem.db")).await;

    // Charged, its response lost: the retry gets the charge's response,
    // and the upstream charged once.
    let lost = post_charge(&gw, "slow-1").await;
    assert_eq!(lost.status(), 502);
    for _ in 0..2 {
        let retry = post_charge(&gw, "slow-1").await;
        assert_eq!(retry.status(), 201);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(retry.text().await.expect("body"), "charged slow-1 (1)");
    }

    // Given up before charging: the retry runs, and is charged once.
    assert_eq!(post_charge(&gw, "dropped-1").await.status(), 502);
    let retry = post_charge(&gw, "dropped-1").await;
    assert_eq!(retry.status(), 201);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(retry.text().await.expect("body"), "charged dropped-1 (1)");

    // No finding: the key stays for a person.
    assert_eq!(post_charge(&gw, "slow-unsure-1").await.status(), 502);
    problem(
        post_charge(&gw, "slow-unsure-1").await,
        422,
        "outcome-unknown",
    )
    .await;

    let charges = ledger.charges.lock().expect("lock").clone();
    assert_eq!(charges["slow-1"], 1);
    assert_eq!(charges["dropped-1"], 1);
    assert_eq!(charges["slow-unsure-1"], 1);
    let asked = ledger.asked.lock().expect("lock").clone();
    assert_eq!(
        asked,
        [
            ("slow-1", "POST", "/charges?currency=eur"),
            ("dropped-1", "POST", "/charges?currency=eur"),
            ("slow-unsure-1", "POST", "/charges?currency=eur"),
        ]
        .map(|(k, m, p)| (k.to_owned(), m.to_owned(), p.to_owned()))
    );
}

#[test]
fn a_reconcile_url_that_cannot_work_is_refused_at_start() {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", "memory:", "proxy", "--listen", "127.0.0.1:0"])
        .args([
            "--upstream",
            "http://127.0.0.1:9",
            "--reconcile",
            "ftp://x/y",
        ])
        .env("IDEM_LOG", "warn")
        .output()
        .expect("ran");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--reconcile must be an http:// or https:// URL"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_sweeps_unknown_outcomes_before_any_retry_comes() {
    use idem::GetRecord;
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("idem.db");
    let (ledger, upstream) = start_upstream().await;
    let upstream = format!("http://{upstream}");
    let reconcile = format!("{upstream}/reconcile");
    let gw = GatewayProcess::start(
        &format!("sqlite:{}", db.display()),
        &[
            "--upstream",
            &upstream,
            "--upstream-timeout",
            "1s",
            "--reconcile",
            &reconcile,
            "--reconcile-every",
            "200ms",
        ],
    )
    .await;
    for key in ["slow-2", "dropped-2", "slow-unsure-2"] {
        assert_eq!(post_charge(&gw, key).await.status(), 502, "{key}");
    }
    // No retry: the sweep asks about each key, with the method and route
    // its scope names (the query string is not kept).
    let start = std::time::Instant::now();
    while ledger.asked.lock().expect("lock").len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(10), "not swept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = ledger.asked.lock().expect("lock").clone();
    for key in ["slow-2", "dropped-2", "slow-unsure-2"] {
        assert!(
            asked.contains(&(key.to_owned(), "POST".to_owned(), "/charges".to_owned())),
            "{key}: {asked:?}"
        );
    }
    let store = format!("sqlite:{}", db.display())
        .parse::<idem_cli::store::StoreUrl>()
        .expect("url")
        .open()
        .await
        .expect("open");
    let state = |key: &str| {
        let id = idem::RecordId::parse("http POST /charges", key).expect("id");
        let store = store.clone();
        async move {
            store
                .get(&id)
                .await
                .expect("get")
                .expect("kept")
                .state
                .kind()
        }
    };
    let settled = std::time::Instant::now();
    while state("slow-2").await != idem::StateKind::Released
        || state("dropped-2").await != idem::StateKind::Released
    {
        assert!(settled.elapsed() < Duration::from_secs(5), "not settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        state("slow-unsure-2").await,
        idem::StateKind::Failed,
        "left for a person"
    );

    // The retries: the charge's response replayed, the dropped one run
    // once; each charged once.
    let retry = post_charge(&gw, "slow-2").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.expect("body"), "charged slow-2 (1)");
    let retry = post_charge(&gw, "dropped-2").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.text().await.expect("body"), "charged dropped-2 (1)");
    let charges = ledger.charges.lock().expect("lock").clone();
    assert_eq!((charges["slow-2"], charges["dropped-2"]), (1, 1));
}
