//! The service behind the gateway in an HTTP run: it applies each
//! request's effect at once (an execution, numbered, appended to an
//! fsynced ledger), then answers after the delay the request asks for, or
//! breaks off its answer midway when the request asks for a reset. It
//! knows nothing of idempotency.
//!
//! Request headers: `idempotency-key` (forwarded by the gateway; the key
//! the execution is recorded under), `x-delay-ms`, and `x-fault`: `reset`
//! breaks the answer off, `slow` marks a delay longer than the gateway
//! waits. Either way the answer is lost on purpose, and the key is noted
//! as broken in the ledger.
//! Answer: `201 {"exec": N, "key": KEY}`.
//!
//! `GET /reconcile` answers the gateway's reconciler (`--reconcile`) from
//! the ledger: a key executed is `Idempotency-Outcome: applied` with its
//! first execution's answer, any other `not-applied` (an execution happens
//! as a request arrives, and the gateway asks only after giving up on it).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use tokio::net::TcpListener;

use crate::error::ChaosError;

/// What the upstream did, in order.
#[derive(Debug, Default)]
struct Ledger {
    file: Option<File>,
    /// Executions per key, by number.
    executions: BTreeMap<String, Vec<u64>>,
    /// Keys whose answer the upstream broke off on purpose.
    broken: Vec<String>,
    next: u64,
}

/// A running upstream.
#[derive(Clone)]
pub(crate) struct Upstream {
    ledger: Arc<Mutex<Ledger>>,
    addr: SocketAddr,
}

impl Upstream {
    /// Starts on a free loopback port, writing its ledger to `path`.
    pub(crate) async fn start(path: &Path) -> Result<Self, ChaosError> {
        let harness = |e: std::io::Error| ChaosError::Harness(format!("upstream: {e}"));
        let file = File::create(path).map_err(harness)?;
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(harness)?;
        let addr = listener.local_addr().map_err(harness)?;
        let upstream = Self {
            ledger: Arc::new(Mutex::new(Ledger {
                file: Some(file),
                ..Ledger::default()
            })),
            addr,
        };
        let app = Router::new()
            .route("/charges", post(charge))
            .route("/reconcile", get(reconcile))
            .with_state(upstream.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(upstream)
    }

    /// Where it listens.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Executions per key.
    pub(crate) fn executions(&self) -> BTreeMap<String, Vec<u64>> {
        self.lock().executions.clone()
    }

    /// Keys whose answers were broken off on purpose.
    pub(crate) fn broken(&self) -> Vec<String> {
        self.lock().broken.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an execution of `key` (fsynced before the answer) and
    /// returns its number.
    fn execute(&self, key: &str) -> u64 {
        let mut ledger = self.lock();
        ledger.next += 1;
        let n = ledger.next;
        ledger.executions.entry(key.to_owned()).or_default().push(n);
        if let Some(file) = ledger.file.as_mut() {
            let _ = writeln!(file, "exec {key} {n}");
            let _ = file.sync_data();
        }
        n
    }

    fn broke(&self, key: &str) {
        let mut ledger = self.lock();
        ledger.broken.push(key.to_owned());
        if let Some(file) = ledger.file.as_mut() {
            let _ = writeln!(file, "broke {key}");
            let _ = file.sync_data();
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn charge(State(upstream): State<Upstream>, headers: HeaderMap) -> Response {
    let Some(key) = header(&headers, "idempotency-key").map(str::to_owned) else {
        return (StatusCode::BAD_REQUEST, "no idempotency-key").into_response();
    };
    let exec = upstream.execute(&key);
    let fault = header(&headers, "x-fault");
    if fault == Some("slow") {
        // Asked to answer later than the gateway waits: the answer is
        // lost on purpose.
        upstream.broke(&key);
    }
    let delay = header(&headers, "x-delay-ms")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    tokio::time::sleep(delay).await;
    if fault == Some("reset") {
        upstream.broke(&key);
        return (StatusCode::CREATED, Body::new(BreaksOff(false))).into_response();
    }
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        answer(exec, &key),
    )
        .into_response()
}

async fn reconcile(State(upstream): State<Upstream>, headers: HeaderMap) -> Response {
    let Some(key) = header(&headers, "idempotency-key") else {
        return (StatusCode::BAD_REQUEST, "no idempotency-key").into_response();
    };
    let first = upstream
        .lock()
        .executions
        .get(key)
        .and_then(|e| e.first().copied());
    match first {
        Some(exec) => (
            StatusCode::CREATED,
            [
                ("content-type", "application/json"),
                ("idempotency-outcome", "applied"),
            ],
            answer(exec, key),
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [("idempotency-outcome", "not-applied")],
        )
            .into_response(),
    }
}

/// The answer to execution `exec` of `key`.
fn answer(exec: u64, key: &str) -> String {
    serde_json::json!({ "exec": exec, "key": key }).to_string()
}

/// A body that sends a few bytes and then fails, so the connection is
/// cut in the middle of the answer.
struct BreaksOff(bool);

impl http_body::Body for BreaksOff {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.0 {
            return Poll::Ready(Some(Err(std::io::Error::other("reset on purpose"))));
        }
        self.0 = true;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{\"exec\":")))))
    }
}
