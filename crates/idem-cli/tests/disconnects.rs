//! The gateway when its clients and its own process go away mid-request:
//! a client that disconnects does not cut its request off (the retry gets
//! the one execution's response, over HTTP/1.1 and over HTTP/2; one
//! passed through without a key is not cut off at the upstream either,
//! over HTTP/1.1), a client that half-closes after its request gets the
//! answer, shutdown waits for such requests, an upstream body that stalls
//! is cut off, and a request whose gateway was SIGKILLed is not forwarded
//! again by the next one.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Connects to `gateway` and sends a POST of `{"amount":100}` on the raw
/// socket, as the `post` helper would (covered when `key` is given),
/// asking the upstream to take `delay_ms`.
async fn send(gateway: &str, key: Option<&str>, delay_ms: u64) -> TcpStream {
    let addr = gateway.trim_start_matches("http://");
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    let body = r#"{"amount":100}"#;
    let key = key.map_or_else(String::new, |key| format!("idempotency-key: {key}\r\n"));
    let request = format!(
        "POST /charge HTTP/1.1\r\nhost: {addr}\r\n{key}\
         content-type: application/json\r\nx-delay-ms: {delay_ms}\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket
        .write_all(request.as_bytes())
        .await
        .expect("request written");
    socket
}

/// [`send`]s, then closes the socket after `after` without reading the
/// answer.
async fn send_and_disconnect(gateway: &str, key: Option<&str>, delay_ms: u64, after: Duration) {
    let socket = send(gateway, key, delay_ms).await;
    tokio::time::sleep(after).await;
    drop(socket);
}

/// Retries `key` as a client would (409 means "still running") until it
/// gets another answer, within 10 s.
async fn retry_until_done(url: &str, key: &str) -> reqwest::Response {
    let start = Instant::now();
    loop {
        let response = post(url, Some(key)).await;
        if response.status() != 409 || start.elapsed() > Duration::from_secs(10) {
            return response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Retries `key` until it is answered, and checks that the answer is the
/// stored one of its first (and only) execution.
async fn retry_gets_the_one_execution(url: &str, key: &str) {
    let retry = retry_until_done(url, key).await;
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let body: serde_json::Value = retry.json().await.expect("json");
    assert_eq!(
        body["charge"], 1,
        "the retry gets the one execution's answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_does_not_cut_its_request_off() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let mut cfg = config(addr);
    // A short lease: were the run cut off with the connection, its claim
    // would be taken over (and the request sent again) within two seconds.
    cfg.lease = Duration::from_secs(2);
    let gw = Gateway::start(sqlite(&dir), cfg).await;
    let url = format!("{}/charge", gw.url);

    send_and_disconnect(&gw.url, Some("gone"), 600, Duration::from_millis(100)).await;
    retry_gets_the_one_execution(&url, "gone").await;

    // Long after the lease: still the stored answer, never a second run.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let late = post(&url, Some("gone")).await;
    assert_eq!(late.headers()["idempotent-replayed"], "true");
    assert_eq!(up.runs("/charge"), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_gives_up_does_not_cut_its_request_off() {
    // HTTP/2 cancels a request whose stream is reset (HTTP/1.1 lets it
    // run): the covered run must go on detached from it.
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let mut cfg = config(addr);
    // As above: were the run cut off, its claim would be taken over.
    cfg.lease = Duration::from_secs(2);
    let gw = Gateway::start(sqlite(&dir), cfg).await;
    let url = format!("{}/charge", gw.url);
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .timeout(Duration::from_millis(100))
        .build()
        .expect("client");

    let gave_up = h2
        .post(&url)
        .header("content-type", "application/json")
        .header("idempotency-key", "h2-gone")
        .header("x-delay-ms", "600")
        .body(r#"{"amount":100}"#)
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()), "the client gave up");
    retry_gets_the_one_execution(&url, "h2-gone").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(up.runs("/charge"), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_passed_through_is_not_cut_off_when_its_client_goes() {
    // An upstream on a raw socket that answers 400 ms after a request,
    // and says whether the gateway closed the connection before that.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (told, mut heard) = mpsc::unbounded_channel::<&'static str>();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let told = told.clone();
            tokio::spawn(async move {
                if !read_request(&mut socket).await {
                    return;
                }
                let mut buf = [0u8; 1];
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(400)) => {
                        let _ = told.send("answered");
                        let _ = socket
                            .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                    }
                    _ = socket.read(&mut buf) => {
                        let _ = told.send("cut off");
                    }
                }
            });
        }
    });
    let dir = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;

    send_and_disconnect(&gw.url, None, 0, Duration::from_millis(100)).await;
    let heard = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .expect("the upstream saw the request");
    assert_eq!(heard, Some("answered"));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    // Passed through and covered; the half-close reaches the gateway
    // while the upstream takes its 300 ms.
    for key in [None, Some("half-closed")] {
        let mut socket = send(&gw.url, key, 300).await;
        socket.shutdown().await.expect("half-closed");
        let mut answer = Vec::new();
        // A connection closed without an answer reads as empty or reset.
        let _ = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 201"), "{key:?}: {answer:?}");
        assert!(answer.contains(r#""body_len":14"#), "{key:?}: {answer:?}");
    }
    assert_eq!(up.runs("/charge"), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_requests_whose_clients_went_away() {
    let dir = tempfile::tempdir().expect("dir");
    let (up, addr) = start_upstream().await;
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    send_and_disconnect(&gw.url, Some("orphan"), 500, Duration::from_millis(100)).await;
    gw.shutdown().await;

    // The next gateway on the same store finds the request completed.
    let gw = Gateway::start(sqlite(&dir), config(addr)).await;
    let again = post(&format!("{}/charge", gw.url), Some("orphan")).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(up.runs("/charge"), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_response_body_is_cut_off_at_the_upstream_timeout() {
    let dir = tempfile::tempdir().expect("dir");
    let (seen, addr) = misbehaving_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial",
        true,
    )
    .await;
    let mut cfg = config(addr);
    cfg.upstream_timeout = Duration::from_millis(800);
    let gw = Gateway::start(sqlite(&dir), cfg).await;
    let url = format!("{}/charge", gw.url);
    let start = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(5), post(&url, Some("stall")))
        .await
        .expect("answered long before the upstream's socket closes");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    let detail = problem(answer, 502, "outcome-unknown").await;
    assert!(detail.contains("did not finish within"), "{detail}");
    let detail = problem(post(&url, Some("stall")).await, 422, "outcome-unknown").await;
    assert!(detail.contains("may have been processed"), "{detail}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    gw.shutdown().await;
}

/// The `idem` binary as a gateway process on `port`.
struct GatewayProcess {
    child: Child,
    url: String,
}

impl GatewayProcess {
    fn start(
        port: u16,
        upstream: std::net::SocketAddr,
        db: &std::path::Path,
        extra: &[&str],
    ) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["proxy", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream", &format!("http://{upstream}")])
            .args(["--store", &format!("sqlite:{}", db.display())])
            .args(["--admin-listen", "off", "--lease", "1s"])
            .args(extra)
            .env("IDEM_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start idem proxy");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn ready(self) -> Self {
        let addr = self.url.trim_start_matches("http://").to_owned();
        let start = Instant::now();
        while TcpStream::connect(&addr).await.is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "gateway not up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL the gateway");
        self.child.wait().expect("reaped");
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The gateway is SIGKILLed while the upstream works on a request; the
/// next gateway on the same store must not send it again when the client
/// retries, unless told to (`--forward-takeovers true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_gateway_died_is_not_forwarded_again() {
    for (forward, status, runs) in [(false, 422, 1), (true, 201, 2)] {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("idem.db");
        let (up, addr) = start_upstream().await;
        let port = idem_testkit::free_port().expect("port");
        let gw = GatewayProcess::start(port, addr, &db, &[]).ready().await;
        let request = {
            let url = format!("{}/charge", gw.url);
            tokio::spawn(async move {
                client()
                    .post(url)
                    .header("idempotency-key", "died")
                    .header("content-type", "application/json")
                    .header("x-delay-ms", "400")
                    .body(r#"{"amount":100}"#)
                    .send()
                    .await
            })
        };
        while up.runs("/charge") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        gw.kill();
        assert!(
            request.await.expect("task").is_err(),
            "its client lost the answer"
        );

        let forward = forward.to_string();
        let gw = GatewayProcess::start(port, addr, &db, &["--forward-takeovers", &forward])
            .ready()
            .await;
        // Past the dead gateway's lease, the client retries.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let url = format!("{}/charge", gw.url);
        let retry = retry_until_done(&url, "died").await;
        assert_eq!(retry.status(), status, "forward takeovers: {forward}");
        if status == 422 {
            let detail = problem(retry, 422, "outcome-unknown").await;
            assert!(detail.contains("lease ran out"), "{detail}");
            let again = post(&url, Some("died")).await;
            assert_eq!(again.status(), 422, "kept until an operator releases it");
        }
        assert_eq!(up.runs("/charge"), runs, "forward takeovers: {forward}");
        gw.kill();
    }
}
