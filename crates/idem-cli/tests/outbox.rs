//! `idem outbox run` against a real JetStream: it sends what runs left
//! pending (their process "died" with the broker away) and what a
//! producer enqueued in the standalone outbox, each once under its id,
//! and a second pass sends nothing.
#![cfg(feature = "nats")]

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use idem::outbox::{MemorySender, Message};
use idem::{HandlerError, Idempotency, RecordId};
use idem_sqlite::outbox::Outbox;
use idem_sqlite::SqliteStore;
use idem_testkit::servers::mysql::MySqlServer;
use idem_testkit::servers::nats::NatsServer;
use rusqlite::{Connection, TransactionBehavior};

const LEASE: Duration = Duration::from_millis(500);

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("IDEM_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("idem runs")
}

/// The JSON report of an `idem … outbox run --once` that must succeed.
fn passed_once(args: &[&str]) -> serde_json::Value {
    let output = idem(args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// The ids of the messages in `name`, as their `Nats-Msg-Id`s, sorted.
async fn ids_in(js: &jetstream::Context, name: &str) -> Vec<String> {
    let reader = js
        .get_stream(name)
        .await
        .expect("the stream")
        .create_consumer(consumer::pull::Config::default())
        .await
        .expect("a consumer");
    let mut batch = reader
        .fetch()
        .max_messages(100)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .expect("fetches");
    let mut ids = Vec::new();
    while let Some(message) = batch.next().await {
        let message = message.expect("a message");
        let header = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id"));
        ids.push(header.expect("Nats-Msg-Id").as_str().to_owned());
    }
    ids.sort();
    ids
}

/// The ids in `name` once they are `expected`, or after 10 s.
async fn ids_within(js: &jetstream::Context, name: &str, expected: &[String]) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = ids_in(js, name).await;
    while seen != expected && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = ids_in(js, name).await;
    }
    seen
}

/// Runs `order-1` and `order-2`, each delivered `deliveries` times, each
/// run sending one message to `NAME.charged`: the messages' ids.
async fn charge_two<S: idem::Store>(
    app: &Idempotency<S>,
    name: &str,
    deliveries: usize,
) -> Vec<String> {
    let mut ids = Vec::new();
    for key in ["order-1", "order-2"] {
        let message = Message::new(format!("{name}.charged"), key.to_owned());
        ids.push(message.id().to_owned());
        let id = RecordId::parse("orders", key).expect("valid");
        for _delivery in 0..deliveries {
            let message = message.clone();
            app.run(&id, None, |ctx| async move {
                ctx.send(message)?;
                Ok::<_, HandlerError>(key.to_owned())
            })
            .await
            .expect("run, then replayed");
        }
    }
    ids
}

/// The NATS URL, a JetStream context and a fresh stream `PREFIX_<random>`
/// taking the subjects under its name.
async fn fresh_stream(prefix: &str) -> (String, jetstream::Context, String) {
    let nats = NatsServer::shared().expect("nats-server").url();
    let name = format!("{prefix}_{:016x}", rand::random::<u64>());
    let js = jetstream::new(async_nats::connect(nats.as_str()).await.expect("connects"));
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        ..Default::default()
    })
    .await
    .expect("the stream");
    (nats, js, name)
}

fn enqueue(path: &std::path::Path, messages: &[Message]) {
    let mut conn = Connection::open(path).expect("opens");
    conn.busy_timeout(Duration::from_secs(5)).expect("set");
    let outbox = Outbox::new();
    outbox.setup(&conn).expect("the outbox table");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .expect("a transaction");
    for message in messages {
        outbox.enqueue(&tx, message).expect("enqueued");
    }
    tx.commit().expect("committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_run_sends_what_runs_and_producers_left_pending_once() {
    let (nats, js, name) = fresh_stream("cli_outbox").await;
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("idem.db");
    let store_url = format!("sqlite:{}", path.display());

    // Two runs complete while their broker is away: their messages are
    // stored with them and left pending for a dispatcher.
    let away = MemorySender::new();
    away.fail(true);
    let app = Idempotency::builder(SqliteStore::open(&path).expect("the store"))
        .lease(LEASE)
        .outbox(away.clone())
        .build()
        .expect("an executor");
    let mut expected = charge_two(&app, &name, 1).await;
    drop(app);
    // And a producer enqueues two in its own transaction.
    let produced = [
        Message::new(format!("{name}.placed"), "a"),
        Message::new(format!("{name}.placed"), "b"),
    ];
    expected.extend(produced.iter().map(|m| m.id().to_owned()));
    enqueue(&path, &produced);
    expected.sort();
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;

    let once = [
        "--store", &store_url, "outbox", "run", "--to", &nats, "--table", "--once",
    ];
    let report = passed_once(&once);
    assert_eq!(report["runs"]["messages"], 2, "{report}");
    assert_eq!(report["runs"]["sent"], 2, "{report}");
    assert_eq!(report["table"]["sent"], 2, "{report}");
    assert_eq!(ids_in(&js, &name).await, expected);

    let report = passed_once(&once);
    assert_eq!(report["runs"]["messages"], 0, "{report}");
    assert_eq!(report["table"]["taken"], 0, "{report}");
    assert_eq!(ids_in(&js, &name).await, expected, "nothing is sent twice");
    assert!(away.messages().is_empty());

    // Running, it sends what is enqueued later, within its interval.
    let mut running = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "--store", &store_url, "outbox", "run", "--to", &nats, "--table",
        ])
        .args(["--every", "100ms"])
        .env("IDEM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("idem outbox run starts");
    let later = Message::new(format!("{name}.placed"), "c");
    enqueue(&path, std::slice::from_ref(&later));
    expected.push(later.id().to_owned());
    expected.sort();
    let seen = ids_within(&js, &name, &expected).await;
    running.kill().expect("stopped");
    running.wait().expect("reaped");
    assert_eq!(seen, expected);

    // A message no stream takes is refused: the pass says so and fails.
    enqueue(&path, &[Message::new(format!("{name}_nowhere.x"), "lost?")]);
    let refused = idem(&once);
    assert!(!refused.status.success(), "a refused send fails the pass");
    let report: serde_json::Value = serde_json::from_slice(&refused.stdout).expect("JSON");
    assert_eq!(report["table"]["failed"], true, "{report}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("stay pending"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_run_sends_the_standalone_outbox_of_mysql() {
    use mysql_async::prelude::Queryable;

    let (nats, js, name) = fresh_stream("cli_outbox_my").await;
    let server = MySqlServer::start().expect("mariadb");
    let url = server.url(&server.create_database("outbox_cli").expect("a database"));
    let pool = mysql_async::Pool::new(url.as_str());
    let outbox = idem_mysql::outbox::Outbox::new();
    let mut conn = pool.get_conn().await.expect("connects");
    outbox.setup(&mut conn).await.expect("the outbox table");
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .expect("a transaction");
    let produced = [
        Message::new(format!("{name}.placed"), "a"),
        Message::new(format!("{name}.placed"), "b"),
    ];
    for message in &produced {
        outbox.enqueue(&mut tx, message).await.expect("enqueued");
    }
    tx.commit().await.expect("committed");
    let mut expected: Vec<_> = produced.iter().map(|m| m.id().to_owned()).collect();
    expected.sort();

    let report = passed_once(&[
        "--store", &url, "outbox", "run", "--to", &nats, "--table", "--once",
    ]);
    assert_eq!(report["table"]["sent"], 2, "{report}");
    assert_eq!(ids_in(&js, &name).await, expected);
    let left: Option<i64> = conn
        .query_first("SELECT count(*) FROM idem_outbox")
        .await
        .expect("counts");
    assert_eq!(left, Some(0));
    drop(conn);
    pool.disconnect().await.expect("disconnects");
}

#[test]
fn outbox_run_says_what_is_wrong_with_its_broker() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store_url = format!("sqlite:{}", dir.path().join("idem.db").display());
    let bad_every = idem(&[
        "--store",
        &store_url,
        "outbox",
        "run",
        "--to",
        "nats://127.0.0.1:1",
        "--every",
        "0s",
    ]);
    let stderr = String::from_utf8_lossy(&bad_every.stderr);
    assert!(stderr.contains("--every"), "{stderr}");
    for (to, said) in [
        ("smtp://mail", "not a broker"),
        ("nats://127.0.0.1:1", "cannot be reached"),
    ] {
        let output = idem(&["--store", &store_url, "outbox", "run", "--to", to, "--once"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{to}");
        assert!(stderr.contains(said), "{to}: {stderr}");
    }
    let output = idem(&[
        "--store",
        "memory:",
        "outbox",
        "run",
        "--to",
        "nats://127.0.0.1:1",
        "--table",
        "--once",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("PostgreSQL, MySQL or SQLite"), "{stderr}");
}

/// `idem serve --outbox` as a process, killed and reaped when dropped.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `idem serve` over `store_url` on a free loopback port with
/// `extra` arguments; its URL once it answers.
fn serve(store_url: &str, extra: &[&str]) -> (Served, String) {
    let port = idem_testkit::free_port().expect("a free port");
    let listen = format!("127.0.0.1:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", store_url, "serve", "--listen", &listen])
        .args(extra)
        .env("IDEM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("idem serve starts");
    let served = Served(child);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&listen).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "idem serve never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (served, format!("http://{listen}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_serve_sends_its_callers_messages_to_jetstream_once() {
    let (nats, js, name) = fresh_stream("cli_serve_outbox").await;
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store_url = format!("sqlite:{}", dir.path().join("idem.db").display());
    let (served, url) = serve(&store_url, &["--outbox", &nats]);
    let store = idem_remote::RemoteStore::builder(&url)
        .expect("the URL")
        .build()
        .expect("the remote store");
    let app = Idempotency::builder(store)
        .outbox_sent_by_store()
        .build()
        .expect("an executor");

    let mut expected = charge_two(&app, &name, 3).await;
    expected.sort();
    assert_eq!(
        ids_within(&js, &name, &expected).await,
        expected,
        "each run's message, once"
    );

    // The runs' records are settled: a dispatcher over the store finds
    // nothing left to send.
    drop(served);
    let report = passed_once(&[
        "--store", &store_url, "outbox", "run", "--to", &nats, "--once",
    ]);
    assert_eq!(report["runs"]["messages"], 0, "{report}");
    assert_eq!(ids_in(&js, &name).await, expected);
}
