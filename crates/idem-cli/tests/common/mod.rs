//! What the gateway tests share: a real upstream that counts its
//! executions, misbehaving upstreams on raw sockets, the gateway on a real
//! listener, and a client.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{self, get};
use axum::Router;
use idem_cli::proxy::{self, ProxyConfig};
use idem_cli::store::AnyStore;
use idem_sqlite::SqliteStore;
use reqwest::header::HeaderValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub mod browser;
pub mod process;

/// Executions per upstream path.
#[derive(Clone, Default)]
pub struct Upstream {
    pub runs: Arc<Mutex<HashMap<String, u64>>>,
}

impl Upstream {
    pub fn bump(&self, path: &str) -> u64 {
        let mut runs = self.runs.lock().expect("lock");
        let n = runs.entry(path.to_owned()).or_default();
        *n += 1;
        *n
    }

    pub fn runs(&self, path: &str) -> u64 {
        self.runs
            .lock()
            .expect("lock")
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

pub async fn charge(State(up): State<Upstream>, headers: HeaderMap, body: Bytes) -> Response {
    let n = up.bump("/charge");
    if let Some(ms) = headers
        .get("x-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let auth = headers
        .get("authorization")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let mut response = (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(
            r#"{{"charge":{n},"for":{},"body_len":{}}}"#,
            serde_json::json!(auth),
            body.len()
        ),
    )
        .into_response();
    let h = response.headers_mut();
    h.append("set-cookie", HeaderValue::from_static("a=1"));
    h.append("set-cookie", HeaderValue::from_static("b=2"));
    h.append("link", HeaderValue::from_static("</a>; rel=a"));
    h.append("link", HeaderValue::from_static("</b>; rel=b"));
    h.insert("x-charge", HeaderValue::from(n));
    response
}

/// 200 with a body and a trailer field (`x-checksum`), named in
/// `Trailer`, as HTTP/1.1 requires for a peer to be sent it.
pub async fn trailers(State(up): State<Upstream>) -> Response {
    use http_body_util::StreamBody;
    let n = up.bump("/trailers");
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from(n));
    let frames = futures_util::stream::iter([
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(b"exported"))),
        Ok(http_body::Frame::trailers(trailers)),
    ]);
    Response::builder()
        .status(StatusCode::OK)
        .header("trailer", "x-checksum")
        .body(axum::body::Body::new(StreamBody::new(frames)))
        .expect("response")
}

pub async fn binary(State(up): State<Upstream>) -> Response {
    up.bump("/binary");
    let body: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    (
        StatusCode::ACCEPTED,
        [("content-type", "application/octet-stream")],
        body,
    )
        .into_response()
}

pub async fn flaky(State(up): State<Upstream>) -> Response {
    match up.bump("/flaky") {
        1 => (StatusCode::SERVICE_UNAVAILABLE, "upstream busy").into_response(),
        n => (StatusCode::CREATED, format!("done on run {n}")).into_response(),
    }
}

pub async fn status(State(up): State<Upstream>, Path(code): Path<u16>) -> Response {
    let n = up.bump(&format!("/status/{code}"));
    (
        StatusCode::from_u16(code).expect("status"),
        format!("status {code}, run {n}"),
    )
        .into_response()
}

pub async fn big(State(up): State<Upstream>) -> Response {
    up.bump("/big");
    vec![b'x'; 4096].into_response()
}

/// Secrets a response carries ([`secret`]); no dump of a store may show
/// them once they are left out, redacted or sealed.
pub const SECRETS: [&str; 3] = ["tok_s3cret", "4242424242424242", "key-s3cret"];

/// 201 with a JSON body holding a minted token and a card number, and an
/// API key in a header.
pub async fn secret(State(up): State<Upstream>) -> Response {
    let n = up.bump("/secret");
    let mut response = (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        format!(r#"{{"id":{n},"token":"tok_s3cret","card":{{"number":"4242424242424242","brand":"visa"}}}}"#),
    )
        .into_response();
    let h = response.headers_mut();
    h.insert("x-api-key", HeaderValue::from_static("key-s3cret"));
    h.insert(
        "location",
        HeaderValue::from_str(&format!("/secret/{n}")).expect("value"),
    );
    response
}

pub async fn read(State(up): State<Upstream>) -> Response {
    format!("read {}", up.bump("/read")).into_response()
}

/// The request's headers as JSON (the last value of each), as the
/// upstream received them.
pub async fn headers(State(up): State<Upstream>, headers: HeaderMap) -> Response {
    up.bump("/headers");
    let seen: HashMap<String, String> = headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&seen).expect("json"),
    )
        .into_response()
}

/// The HTTP version a request came in with, as text (`HTTP/2.0`).
pub async fn version(State(up): State<Upstream>, request: axum::extract::Request) -> Response {
    up.bump("/version");
    format!("{:?}", request.version()).into_response()
}

/// The test upstream's routes, and its execution counts.
pub fn upstream_app() -> (Upstream, Router) {
    let up = Upstream::default();
    let app = Router::new()
        .route("/charge", routing::post(charge))
        .route("/binary", routing::post(binary))
        .route("/flaky", routing::post(flaky))
        .route("/status/{code}", routing::post(status))
        .route("/big", routing::post(big))
        .route("/secret", routing::post(secret))
        .route("/read", get(read))
        .route("/headers", routing::post(headers).get(headers))
        .route("/version", routing::post(version))
        .route("/trailers", routing::post(trailers))
        .with_state(up.clone());
    (up, app)
}

pub async fn start_upstream_on(listener: TcpListener) -> Upstream {
    let (up, app) = upstream_app();
    tokio::spawn(async move { axum::serve(listener, app).await });
    up
}

pub async fn start_upstream() -> (Upstream, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    (start_upstream_on(listener).await, addr)
}

pub fn config(upstream: SocketAddr) -> ProxyConfig {
    ProxyConfig {
        upstream: format!("http://{upstream}").parse().expect("uri"),
        upstream_protocol: Default::default(),
        methods: vec![http::Method::POST, http::Method::PATCH],
        header: http::HeaderName::from_static("idempotency-key"),
        require_key: false,
        key_in_body: None,
        fingerprint_fields: None,
        webhook: None,
        mcp: None,
        tenant_header: None,
        retention: Duration::from_secs(3600),
        lease: Duration::from_secs(30),
        max_request_bytes: 1 << 20,
        max_response_bytes: 1 << 20,
        fail_open: false,
        upstream_timeout: Duration::from_secs(10),
        forward_takeovers: false,
        reconcile: None,
        reconcile_every: None,
        reject_old_uuid_v7: false,
        max_wait: Duration::from_secs(10),
        default_wait: Duration::ZERO,
        replay_cache_bytes: idem::DEFAULT_REPLAY_CACHE_BYTES,
        replay_cache_ttl: idem::DEFAULT_REPLAY_CACHE_TTL,
        replay_drop_headers: Vec::new(),
        replay_set_cookie: false,
        grpc_request_id_fields: Vec::new(),
        keep: Default::default(),
        blobs: None,
        keyring: None,
        key_hasher: None,
        forwarded: Default::default(),
        tls: None,
    }
}

/// A running gateway; dropping `stop` (or sending on it) shuts it down.
pub struct Gateway {
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Gateway {
    pub async fn start(store: AnyStore, config: ProxyConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            proxy::serve(store, &config, listener, None, async {
                let _ = stopped.await;
            })
            .await
        });
        Self {
            url,
            stop: Some(stop),
            done,
        }
    }

    pub async fn shutdown(mut self) {
        drop(self.stop.take());
        (&mut self.done)
            .await
            .expect("gateway task")
            .expect("gateway served");
    }
}

pub fn sqlite(dir: &tempfile::TempDir) -> AnyStore {
    AnyStore::Sqlite(
        SqliteStore::builder(dir.path().join("idem.db"))
            .busy_timeout(Duration::from_millis(200))
            .open()
            .expect("open"),
    )
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

pub async fn post(url: &str, key: Option<&str>) -> reqwest::Response {
    let mut request = client()
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"amount":100}"#);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request.send().await.expect("request sent")
}

pub async fn problem(response: reqwest::Response, status: u16, kind: &str) -> String {
    assert_eq!(response.status().as_u16(), status);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: serde_json::Value = response.json().await.expect("problem json");
    assert_eq!(body["status"], status);
    assert!(
        body["type"].as_str().expect("type").ends_with(kind),
        "{body}"
    );
    body["detail"].as_str().expect("detail").to_owned()
}

/// Reads one of the test client's requests (its body is
/// `{"amount":100}`) from a raw upstream's `socket`; `false` if the
/// connection ended or failed first.
pub async fn read_request(socket: &mut tokio::net::TcpStream) -> bool {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.ends_with(br#"{"amount":100}"#) {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// An upstream on a raw socket: it counts each request it reads in full,
/// then misbehaves as `answer` says (closes at once, or sends a head and
/// part of the body and closes, or never answers).
pub async fn broken_upstream(answer: &'static [u8]) -> (Arc<AtomicU64>, SocketAddr) {
    misbehaving_upstream(answer, false).await
}

/// As [`broken_upstream`]; with `hold_open` the connection stays open
/// (silent) for 30 s after the answer instead of closing.
pub async fn misbehaving_upstream(
    answer: &'static [u8],
    hold_open: bool,
) -> (Arc<AtomicU64>, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                if !read_request(&mut socket).await {
                    return;
                }
                counter.fetch_add(1, Ordering::SeqCst);
                if answer.is_empty() {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                let _ = socket.write_all(answer).await;
                if hold_open {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            });
        }
    });
    (seen, addr)
}

/// The claim API's settings the `idem serve` tests start from: `tenants`,
/// a 30 s lease, an hour's retention and longest lease, 5 s of waiting
/// and 1 MiB bodies.
pub fn serve_config(tenants: idem_cli::serve::Tenants) -> idem_cli::serve::ServeConfig {
    idem_cli::serve::ServeConfig {
        tenants,
        lease: Duration::from_secs(30),
        retention: Duration::from_secs(3600),
        max_wait: Duration::from_secs(5),
        max_request_bytes: 1 << 20,
        max_lease: Duration::from_secs(3600),
        secrets: Default::default(),
        tls: None,
        outbox: None,
    }
}

/// What a [`keep_alive_upstream`] has seen.
#[derive(Clone, Default)]
pub struct Connections {
    /// Connections accepted.
    pub opened: Arc<AtomicU64>,
    /// Requests read in full and answered.
    pub requests: Arc<AtomicU64>,
}

/// An HTTP/1.1 upstream on a raw socket that answers every request on a
/// connection with `201` and `ok` (no body to `HEAD`), keeping the
/// connection open; with `close_after`, it closes each connection that
/// long after its last answer, as a server's idle timeout does.
pub async fn keep_alive_upstream(close_after: Option<Duration>) -> (Connections, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Connections::default();
    let counters = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counters.opened.fetch_add(1, Ordering::SeqCst);
            let requests = Arc::clone(&counters.requests);
            tokio::spawn(async move {
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Some(length) = request_length(&pending) else {
                        let read = match close_after {
                            Some(idle) => tokio::time::timeout(idle, socket.read(&mut buf))
                                .await
                                .unwrap_or(Ok(0)),
                            None => socket.read(&mut buf).await,
                        };
                        match read {
                            Ok(0) | Err(_) => return,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = pending.starts_with(b"HEAD ");
                    pending.drain(..length);
                    requests.fetch_add(1, Ordering::SeqCst);
                    let answer: &[u8] = if head {
                        b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n"
                    } else {
                        b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok"
                    };
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (seen, addr)
}

/// The length of the first whole request in `bytes` (head and
/// `Content-Length` body), if it is all there.
fn request_length(bytes: &[u8]) -> Option<usize> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
    let body: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("content-length"));
    (bytes.len() >= end + body).then_some(end + body)
}

/// The Python holding the off-the-shelf SDKs the tests drive (Stripe's,
/// Standard Webhooks'), installed by `scripts/test`.
pub fn sdk_python() -> std::path::PathBuf {
    let tools = std::env::var_os("IDEM_TOOLS").map_or_else(
        || {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/idem/tools")
        },
        std::path::PathBuf::from,
    );
    let python = tools.join("sdks/bin/python");
    assert!(
        python.is_file(),
        "the Python SDKs are not installed at {}: run scripts/test, which installs it \
         (ensure_python_sdks in scripts/lib.sh)",
        python.display()
    );
    python
}

/// Runs `tests/sdk/SCRIPT` with the SDKs' Python and `args`, asserts it
/// succeeded, and returns the JSON line it printed for each step.
pub async fn run_sdk_script(script: &str, args: &[String]) -> Vec<serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(script);
    let output = tokio::process::Command::new(sdk_python())
        .arg(path)
        .args(args)
        .env("NO_PROXY", "*")
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}
