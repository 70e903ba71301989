//! The gateway over the protocols of real deployments: an `https://`
//! upstream signed by a private CA (HTTP/2 by ALPN), a TLS listener whose
//! certificate is replaced on SIGHUP, HTTP/2 clients in cleartext (h2c),
//! and gRPC unary calls (tonic on both sides) replayed with their trailers.

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use common::{config, sqlite, start_upstream, upstream_app, Gateway, Upstream};
use http::uri::PathAndQuery;
use http_body_util::BodyExt;
use idem_cli::tls::{self, Certificate, TlsFiles};
use idem_cli::upstream::UpstreamProtocol;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;

/// A private CA and a certificate for `localhost` it signed, as PEM files.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Pki {
    /// A new CA named `name` and its `localhost` certificate, in `dir`.
    fn new(dir: &Path, name: &str) -> Self {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("idem test CA {name}"));
        let ca_cert = ca.clone().self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("certificate");
        let pki = Self {
            ca: dir.join(format!("{name}-ca.pem")),
            cert: dir.join(format!("{name}-cert.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&pki.ca, ca_cert.pem()).expect("write");
        std::fs::write(&pki.cert, cert.pem()).expect("write");
        std::fs::write(&pki.key, key.serialize_pem()).expect("write");
        pki
    }

    fn files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }

    fn root(&self) -> reqwest::Certificate {
        reqwest::Certificate::from_pem(&std::fs::read(&self.ca).expect("read")).expect("PEM")
    }
}

/// The test upstream over TLS with `pki`'s certificate; its port.
async fn https_upstream(pki: &Pki) -> (Upstream, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (up, app) = upstream_app();
    let acceptor = Certificate::load(pki.files()).expect("load").acceptor();
    tokio::spawn(tls::serve(
        listener,
        acceptor,
        app,
        std::future::pending::<()>(),
    ));
    (up, port)
}

async fn post_keyed(client: &reqwest::Client, url: &str, key: &str) -> reqwest::Response {
    client
        .post(url)
        .header("idempotency-key", key)
        .body("{}")
        .send()
        .await
        .expect("send")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_signed_by_a_private_ca_is_reached_over_http2_and_runs_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "upstream");
    let (up, port) = https_upstream(&pki).await;
    let upstream: http::Uri = format!("https://localhost:{port}").parse().expect("uri");
    let client = common::client();

    // Without the CA the handshake fails: nothing was sent, so the key is
    // released and the same request may be retried.
    let mut untrusting = config("127.0.0.1:1".parse().expect("addr"));
    untrusting.upstream = upstream.clone();
    let gateway = Gateway::start(sqlite(&dir), untrusting).await;
    let refused = post_keyed(&client, &format!("{}/version", gateway.url), "tls-1").await;
    let detail = common::problem(refused, 502, "upstream-unavailable").await;
    assert!(detail.contains("could not be reached"), "{detail}");
    assert_eq!(up.runs("/version"), 0);
    gateway.shutdown().await;

    let mut trusting = config("127.0.0.1:1".parse().expect("addr"));
    trusting.upstream = upstream;
    trusting.upstream_protocol = UpstreamProtocol {
        ca_file: Some(pki.ca.clone()),
        http2_only: false,
    };
    let gateway = Gateway::start(sqlite(&dir), trusting).await;
    let url = format!("{}/version", gateway.url);
    let first = post_keyed(&client, &url, "tls-1").await;
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(first.text().await.expect("body"), "HTTP/2.0", "h2 by ALPN");
    let again = post_keyed(&client, &url, "tls-1").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.expect("body"), "HTTP/2.0");
    assert_eq!(
        up.runs("/version"),
        1,
        "the released key ran once, then replayed"
    );
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_speaking_http2_in_cleartext_gets_one_execution_and_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = start_upstream().await;
    let gateway = Gateway::start(sqlite(&dir), config(upstream)).await;
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let url = format!("{}/charge", gateway.url);
    let first = post_keyed(&h2, &url, "h2c-1").await;
    assert_eq!(first.version(), reqwest::Version::HTTP_2);
    assert_eq!(first.status(), 201);
    let body = first.text().await.expect("body");
    let again = post_keyed(&h2, &url, "h2c-1").await;
    assert_eq!(again.version(), reqwest::Version::HTTP_2);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let links: Vec<_> = again.headers().get_all("link").iter().collect();
    assert_eq!(links, ["</a>; rel=a", "</b>; rel=b"]);
    assert_eq!(again.text().await.expect("body"), body);
    assert_eq!(up.runs("/charge"), 1);

    // HTTP/2 lets a client split Cookie; an HTTP/1.1 upstream gets one.
    let seen: serde_json::Value = h2
        .get(format!("{}/headers", gateway.url))
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(seen["cookie"], "a=1; b=2");
    gateway.shutdown().await;
}

/// Until `check` holds, at most `limit`.
async fn eventually<F: Future<Output = bool>>(limit: Duration, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client that trusts only `root`.
fn trusting(root: &reqwest::Certificate) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root.clone())
}

/// Whether a new connection from a client trusting only `root` gets an
/// answer from `url`.
async fn trusted(root: &reqwest::Certificate, url: &str) -> bool {
    let client = trusting(root).build().expect("client");
    client.get(url).send().await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_speaks_both_versions_and_takes_a_new_certificate_on_sighup() {
    // A SIGHUP handler first: the signal must never meet the default
    // action, which ends the process.
    let mut hangups =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).expect("SIGHUP");
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Pki::new(dir.path(), "first");
    let (up, upstream) = start_upstream().await;
    let mut settings = config(upstream);
    settings.tls = Some(first.files());
    let gateway = Gateway::start(sqlite(&dir), settings).await;
    let base = gateway.url.replace("http://127.0.0.1", "https://localhost");

    let client = trusting(&first.root()).build().expect("client");
    let url = format!("{base}/headers");
    let h2 = post_keyed(&client, &url, "tls-in-1").await;
    assert_eq!(h2.version(), reqwest::Version::HTTP_2, "h2 by ALPN");
    let seen: serde_json::Value = h2.json().await.expect("json");
    assert_eq!(seen["x-forwarded-proto"], "https");
    let h1 = trusting(&first.root())
        .http1_only()
        .build()
        .expect("client");
    let replay = post_keyed(&h1, &url, "tls-in-1").await;
    assert_eq!(replay.version(), reqwest::Version::HTTP_11);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(up.runs("/headers"), 1);

    // A renewed certificate (from another CA, to tell them apart) is put
    // in place and the process told.
    let second = Pki::new(dir.path(), "second");
    std::fs::copy(&second.cert, &first.cert).expect("copy");
    std::fs::copy(&second.key, &first.key).expect("copy");
    hangup();
    hangups.recv().await.expect("SIGHUP seen");
    let (old, new) = (first.root(), second.root());
    eventually(Duration::from_secs(10), || trusted(&new, &url)).await;
    assert!(!trusted(&old, &url).await, "the old certificate is gone");

    // A pair that does not load is refused; the one in use stays.
    std::fs::write(&first.key, "not a key").expect("write");
    hangup();
    hangups.recv().await.expect("SIGHUP seen");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(trusted(&new, &url).await, "still served after a bad reload");
    gateway.shutdown().await;
}

/// SIGHUP to this process (by its own, positive, PID).
fn hangup() {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// The gRPC messages, as `prost` would generate them.
#[derive(Clone, PartialEq, prost::Message)]
struct ChargeRequest {
    #[prost(string, tag = "1")]
    order: String,
    #[prost(uint64, tag = "2")]
    cents: u64,
    /// AIP-155: a UUID the client keeps across its retries.
    #[prost(string, tag = "3")]
    request_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ChargeReply {
    #[prost(uint64, tag = "1")]
    charge: u64,
}

const CHARGE: &str = "/shop.Payments/Charge";

/// The server side of `shop.Payments/Charge`: counts its runs, declines
/// orders named `declined` with FAILED_PRECONDITION, answers the first run
/// of `busy` with UNAVAILABLE, and takes 300 ms over `slow`.
#[derive(Clone)]
struct Payments(Upstream);

impl tonic::server::UnaryService<ChargeRequest> for Payments {
    type Response = ChargeReply;
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<ChargeReply>, tonic::Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<ChargeRequest>) -> Self::Future {
        let request = request.into_inner();
        let n = self.0.bump(&format!("{CHARGE}/{}", request.order));
        Box::pin(async move {
            match request.order.as_str() {
                "declined" => return Err(tonic::Status::failed_precondition("card declined")),
                "busy" if n == 1 => return Err(tonic::Status::unavailable("try again")),
                "slow" => tokio::time::sleep(Duration::from_millis(300)).await,
                _ => {}
            }
            Ok(tonic::Response::new(ChargeReply { charge: n }))
        })
    }
}

/// `shop.Payments` as the service a tonic server runs.
#[derive(Clone)]
struct PaymentsServer(Payments);

impl tower::Service<http::Request<tonic::body::Body>> for PaymentsServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let payments = self.0.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<ChargeReply, ChargeRequest>::default();
            Ok(tonic::server::Grpc::new(codec)
                .unary(payments, request)
                .await)
        })
    }
}

/// A tonic gRPC server (tonic's own, which cancels a call at its
/// `grpc-timeout`) in cleartext HTTP/2; its address.
async fn grpc_upstream() -> (Upstream, std::net::SocketAddr) {
    let up = Upstream::default();
    let server = PaymentsServer(Payments(up.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
        server,
        tonic::transport::server::TcpIncoming::from(listener),
    ));
    (up, addr)
}

/// A tonic client to the gateway at `url`.
async fn grpc_channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(url.to_owned())
        .expect("url")
        .connect()
        .await
        .expect("connect")
}

async fn charge(
    channel: &tonic::transport::Channel,
    key: &str,
    order: &str,
) -> Result<tonic::Response<ChargeReply>, tonic::Status> {
    call(channel, Some(key), order, None).await
}

/// One call of `Charge`, with a key if given, and a deadline if given: sent
/// as `grpc-timeout` and kept by the client, which gives up when it passes
/// (as grpc-go and grpcio do).
async fn call(
    channel: &tonic::transport::Channel,
    key: Option<&str>,
    order: &str,
    deadline: Option<Duration>,
) -> Result<tonic::Response<ChargeReply>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    let mut request = tonic::Request::new(ChargeRequest {
        order: order.to_owned(),
        cents: 1250,
        request_id: String::new(),
    });
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().expect("metadata"));
    }
    let sent = grpc.unary(
        request_with_deadline(request, deadline),
        PathAndQuery::from_static(CHARGE),
        tonic_prost::ProstCodec::<ChargeRequest, ChargeReply>::default(),
    );
    match deadline {
        Some(deadline) => tokio::time::timeout(deadline, sent)
            .await
            .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("client deadline"))),
        None => sent.await,
    }
}

fn request_with_deadline<T>(
    mut request: tonic::Request<T>,
    deadline: Option<Duration>,
) -> tonic::Request<T> {
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    request
}

/// One gRPC call's trailers, read off the wire by a plain HTTP/2 client.
async fn grpc_trailers(url: &str, key: &str) -> http::HeaderMap {
    use prost::Message as _;
    let message = ChargeRequest {
        order: "o-1".to_owned(),
        cents: 1250,
        request_id: String::new(),
    }
    .encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    framed.extend_from_slice(&message);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(format!("{url}{CHARGE}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", key)
        .body(http_body_util::Full::new(bytes::Bytes::from(framed)))
        .expect("request");
    let response = client.request(request).await.expect("response");
    let collected = response.into_body().collect().await.expect("body");
    collected.trailers().cloned().expect("trailers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unary_calls_through_the_gateway_run_once_and_replay_with_their_trailers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = grpc_upstream().await;
    let mut settings = config(upstream);
    settings.upstream_protocol.http2_only = true;
    let gateway = Gateway::start(sqlite(&dir), settings).await;
    let channel = grpc_channel(&gateway.url).await;

    // A reply's grpc-status travels in trailers: without them a replay
    // would not decode.
    let first = charge(&channel, "g-1", "o-1").await.expect("charged");
    assert_eq!(first.get_ref().charge, 1);
    assert!(first.metadata().get("idempotent-replayed").is_none());
    let again = charge(&channel, "g-1", "o-1").await.expect("replayed");
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(
        again
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.to_str().ok()),
        Some(Some("true"))
    );
    assert_eq!(up.runs(&format!("{CHARGE}/o-1")), 1);
    let replayed = grpc_trailers(&gateway.url, "g-1").await;
    assert_eq!(replayed["grpc-status"], "0", "{replayed:?}");
    assert_eq!(up.runs(&format!("{CHARGE}/o-1")), 1);

    // An error status is an answer too, replayed as given.
    for _ in 0..2 {
        let declined = charge(&channel, "g-2", "declined")
            .await
            .expect_err("declined");
        assert_eq!(declined.code(), tonic::Code::FailedPrecondition);
        assert_eq!(declined.message(), "card declined");
    }
    assert_eq!(up.runs(&format!("{CHARGE}/declined")), 1);

    // UNAVAILABLE is gRPC's 503: not stored, the key released, and the
    // client's retry runs.
    let busy = charge(&channel, "g-3", "busy").await.expect_err("busy");
    assert_eq!(busy.code(), tonic::Code::Unavailable);
    let retried = charge(&channel, "g-3", "busy").await.expect("ran again");
    assert_eq!(retried.get_ref().charge, 2);
    assert!(retried.metadata().get("idempotent-replayed").is_none());
    let replayed = charge(&channel, "g-3", "busy").await.expect("replayed");
    assert_eq!(replayed.get_ref().charge, 2);
    assert_eq!(up.runs(&format!("{CHARGE}/busy")), 2);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_client_deadline_neither_cancels_the_upstream_nor_frees_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = grpc_upstream().await;
    let mut settings = config(upstream);
    settings.upstream_protocol.http2_only = true;
    let gateway = Gateway::start(sqlite(&dir), settings).await;
    let channel = grpc_channel(&gateway.url).await;

    // The client gives up after 100 ms of a 300 ms call; the upstream must
    // not be told to give up too (tonic's server would cancel the handler
    // and answer CANCELLED, and a released key would run the retry again).
    let deadline = Some(Duration::from_millis(100));
    let first = call(&channel, Some("d-1"), "slow", deadline)
        .await
        .expect_err("past the client's deadline");
    // tonic's channel keeps the deadline too: CANCELLED, "Timeout expired".
    assert!(
        matches!(
            first.code(),
            tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        ),
        "{first:?}"
    );

    // The retry is told to wait while the first call runs, then replayed.
    let started = Instant::now();
    let mut pushbacks = 0;
    let replayed = loop {
        match charge(&channel, "d-1", "slow").await {
            Ok(reply) => break reply,
            Err(status) if status.code() == tonic::Code::Aborted => {
                let pushback: u64 = status
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .expect("ABORTED carries grpc-retry-pushback-ms");
                assert!(pushback <= 1000, "{pushback}");
                pushbacks += 1;
                tokio::time::sleep(Duration::from_millis(pushback.min(100))).await;
            }
            Err(status) => panic!("retry: {status:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never replayed"
        );
    };
    assert_eq!(replayed.get_ref().charge, 1, "the first run's reply");
    assert_eq!(
        replayed
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.to_str().ok()),
        Some(Some("true"))
    );
    assert!(pushbacks > 0, "the retry came while the first call ran");
    assert_eq!(up.runs(&format!("{CHARGE}/slow")), 1);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_callers_get_the_gateways_answers_as_grpc_statuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = grpc_upstream().await;
    let mut settings = config(upstream);
    settings.upstream_protocol.http2_only = true;
    settings.require_key = true;
    let gateway = Gateway::start(sqlite(&dir), settings).await;
    let channel = grpc_channel(&gateway.url).await;

    let missing = call(&channel, None, "o-1", None).await.expect_err("no key");
    assert_eq!(missing.code(), tonic::Code::InvalidArgument, "{missing:?}");
    assert!(missing.message().contains("idempotency-key"), "{missing:?}");
    let malformed = call(&channel, Some("has space"), "o-1", None)
        .await
        .expect_err("bad key");
    assert_eq!(
        malformed.code(),
        tonic::Code::InvalidArgument,
        "{malformed:?}"
    );
    assert!(malformed.message().contains("0x20"), "{malformed:?}");

    charge(&channel, "m-1", "o-1").await.expect("charged");
    let reused = charge(&channel, "m-1", "o-2")
        .await
        .expect_err("another request under a used key");
    assert_eq!(reused.code(), tonic::Code::FailedPrecondition, "{reused:?}");
    assert_eq!(up.runs(&format!("{CHARGE}/o-2")), 0);

    // The store down (another connection holds its write lock past its
    // busy timeout): UNAVAILABLE, nothing run.
    let locker = rusqlite::Connection::open(dir.path().join("idem.db")).expect("open");
    locker.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let down = charge(&channel, "s-1", "o-3")
        .await
        .expect_err("store down");
    assert_eq!(down.code(), tonic::Code::Unavailable, "{down:?}");
    assert_eq!(up.runs(&format!("{CHARGE}/o-3")), 0);
    locker.execute_batch("ROLLBACK").expect("unlock");
    gateway.shutdown().await;
}

/// A gRPC call without a key in its metadata is keyed by its message's
/// AIP-155 `request_id` field when the gateway is told which field of
/// which method's message; other methods' messages are not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_request_id_field_keys_calls_without_metadata() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = grpc_upstream().await;
    let mut settings = config(upstream);
    settings.upstream_protocol.http2_only = true;
    settings.require_key = true;
    settings.grpc_request_id_fields = vec![(Some(CHARGE.to_owned()), 3)];
    let gateway = Gateway::start(sqlite(&dir), settings).await;
    let channel = grpc_channel(&gateway.url).await;
    let call_with_id = |method: &'static str, request_id: &str, order: &str| {
        let message = ChargeRequest {
            order: order.to_owned(),
            cents: 1250,
            request_id: request_id.to_owned(),
        };
        let channel = channel.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.expect("channel ready");
            grpc.unary(
                tonic::Request::new(message),
                PathAndQuery::from_static(method),
                tonic_prost::ProstCodec::<ChargeRequest, ChargeReply>::default(),
            )
            .await
        }
    };
    let charge_with_id = |request_id: &str, order: &str| call_with_id(CHARGE, request_id, order);
    let id = "018f6b1e-2c3d-7a4b-8c9d-0e1f2a3b4c5d";
    let first = charge_with_id(id, "aip-1").await.expect("charged");
    let again = charge_with_id(id, "aip-1").await.expect("replayed");
    assert_eq!(again.get_ref(), first.get_ref());
    assert_eq!(
        again
            .metadata()
            .get("idempotent-replayed")
            .map(|v| v.to_str().ok()),
        Some(Some("true"))
    );
    assert_eq!(up.runs(&format!("{CHARGE}/aip-1")), 1);
    // Neither metadata nor request_id: the key is missing.
    let missing = charge_with_id("", "aip-2").await.expect_err("no key");
    assert_eq!(missing.code(), tonic::Code::InvalidArgument, "{missing:?}");
    let bad = charge_with_id("has space", "aip-2")
        .await
        .expect_err("bad key");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
    assert!(bad.message().contains("request_id"), "{bad:?}");
    assert_eq!(up.runs(&format!("{CHARGE}/aip-2")), 0);
    // Another method's message is not read for a key: the same bad
    // request_id is a missing key there, not a malformed one.
    let other = call_with_id("/shop.Payments/Refund", "has space", "aip-3")
        .await
        .expect_err("no key for this method");
    assert_eq!(other.code(), tonic::Code::InvalidArgument, "{other:?}");
    assert!(!other.message().contains("request_id"), "{other:?}");
    gateway.shutdown().await;
}

/// `Trailer` names a response's trailer fields; an HTTP/1.1 peer is sent
/// only the trailers it names, so it is forwarded and replayed, not
/// stripped as hop-by-hop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reach_http1_clients_first_and_on_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (up, upstream) = start_upstream().await;
    let gateway = Gateway::start(sqlite(&dir), config(upstream)).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    for round in 0..2 {
        let request = http::Request::post(format!("{}/trailers", gateway.url))
            .header("te", "trailers")
            .header("idempotency-key", "t-1")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("request");
        let response = client.request(request).await.expect("response");
        assert_eq!(response.version(), http::Version::HTTP_11);
        assert_eq!(response.headers()["trailer"], "x-checksum", "round {round}");
        assert_eq!(
            response.headers().contains_key("idempotent-replayed"),
            round == 1
        );
        let collected = response.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        assert_eq!(
            trailers.as_ref().and_then(|t| t.get("x-checksum")),
            Some(&http::HeaderValue::from_static("1")),
            "round {round}: {trailers:?}"
        );
        assert_eq!(collected.to_bytes(), "exported");
    }
    assert_eq!(up.runs("/trailers"), 1);
    gateway.shutdown().await;
}

#[test]
fn certificate_files_that_cannot_work_are_refused_at_start_with_the_file_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path(), "start");
    let other = Pki::new(dir.path(), "other");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");

    let err = idem_cli::upstream::client(
        &"http://127.0.0.1:9".parse().expect("uri"),
        &UpstreamProtocol {
            ca_file: Some(garbage.clone()),
            http2_only: false,
        },
        Duration::from_secs(1),
    )
    .expect_err("no certificate in the CA file");
    assert!(err.to_string().contains("--upstream-ca"), "{err}");
    assert!(err.to_string().contains("garbage.pem"), "{err}");

    let mismatched = TlsFiles {
        cert: pki.cert.clone(),
        key: other.key.clone(),
    };
    let err = Certificate::load(mismatched).expect_err("another certificate's key");
    assert!(err.to_string().contains("do not make a pair"), "{err}");
    let missing = TlsFiles {
        cert: dir.path().join("absent.pem"),
        key: pki.key.clone(),
    };
    let err = Certificate::load(missing).expect_err("no such file");
    assert!(err.to_string().contains("absent.pem"), "{err}");
}
