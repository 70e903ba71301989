//! idem's own executor over `idem serve` (`idem_remote::RemoteStore`),
//! `idem serve` on a real listener over the embedded SQLite store: runs
//! once among concurrent duplicates, replays, fails by class, journals
//! steps, and a run whose completion finds `idem serve` restarting is
//! completed once it is back, not taken over and run again.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::outbox::{MemorySender, Message};
use idem::step::Retry;
use idem::{FailureClass, HandlerError, Idempotency, Outcome, RecordId, RunError};
use idem_cli::serve::{self, ServeConfig, ServeOutbox, Tenants};
use idem_cli::store::AnyStore;
use idem_remote::RemoteStore;
use idem_sqlite::SqliteStore;

const TOKEN: &str = "shop-token-0123456789abcdef";

/// `idem serve` over one SQLite file, stopped and started again on the
/// same port.
struct Server {
    addr: SocketAddr,
    file: PathBuf,
    tune: fn(&mut ServeConfig),
    outbox: Option<ServeOutbox>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Server {
    async fn start(file: PathBuf) -> Self {
        Self::with(file, |_| {}, None).await
    }

    /// A server whose settings `tune` changes, sending runs' messages
    /// through `outbox` (none: left to a dispatcher elsewhere).
    async fn with(file: PathBuf, tune: fn(&mut ServeConfig), outbox: Option<ServeOutbox>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mut server = Self {
            addr: listener.local_addr().expect("addr"),
            file,
            tune,
            outbox,
            stop: None,
            task: None,
        };
        server.serve(listener);
        server
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let store = AnyStore::Sqlite(SqliteStore::open(&self.file).expect("open"));
        let tokens = vec![TOKEN.to_owned()];
        let mut config =
            common::serve_config(Tenants::new([("shop", tokens.as_slice())]).expect("tenants"));
        config.outbox = self.outbox.clone();
        (self.tune)(&mut config);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        self.stop = Some(stop);
        self.task = Some(tokio::spawn(serve::serve(
            store,
            config,
            listener,
            async move {
                let _ = stopped.await;
            },
        )));
    }

    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("join").expect("served cleanly");
        }
    }

    async fn start_again(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("bind the same port");
        self.serve(listener);
    }

    fn store(&self) -> RemoteStore {
        RemoteStore::builder(&format!("http://{}", self.addr))
            .expect("url")
            .token(TOKEN)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("store")
    }
}

fn id(key: &str) -> RecordId {
    RecordId::parse("remote", key).expect("id")
}

type Io = std::io::Error;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executor_over_idem_serve_runs_once_replays_and_fails_by_class() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = Server::start(dir.path().join("idem.db")).await;
    let idem = Idempotency::builder(server.store())
        .build()
        .expect("executor");

    let runs = Arc::new(AtomicU32::new(0));
    let duplicates = (0..16).map(|_| {
        let (idem, runs) = (idem.clone(), runs.clone());
        tokio::spawn(async move {
            idem.run(&id("charge"), None, |ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Io>(format!("charged under fence {}", ctx.fence().unwrap_or(0)))
            })
            .await
        })
    });
    let mut executed = 0;
    for run in duplicates.collect::<Vec<_>>() {
        match run.await.expect("task") {
            Ok(Outcome::Executed { value, .. }) => {
                executed += 1;
                assert_eq!(value, "charged under fence 1");
            }
            Ok(Outcome::Replayed { value }) => assert_eq!(value, "charged under fence 1"),
            Err(RunError::InProgress { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((executed, runs.load(Ordering::SeqCst)), (1, 1));
    // A new executor: the replay comes from idem serve, not from memory.
    let idem = Idempotency::builder(server.store())
        .build()
        .expect("executor");
    let again = idem
        .run(&id("charge"), None, |_| async {
            Ok::<_, Io>("ran twice".to_owned())
        })
        .await
        .expect("replayed");
    assert_eq!(
        again,
        Outcome::Replayed {
            value: "charged under fence 1".to_owned()
        }
    );

    let declined = idem
        .run(&id("declined"), None, |_| async {
            Err::<String, _>(HandlerError::terminal("card declined"))
        })
        .await;
    assert!(
        matches!(
            &declined,
            Err(RunError::Handler {
                class: FailureClass::Terminal,
                ..
            })
        ),
        "{declined:?}"
    );
    let replayed = idem
        .run(&id("declined"), None, |_| async {
            Ok::<_, HandlerError>("ran".to_owned())
        })
        .await;
    assert!(
        matches!(&replayed, Err(RunError::Failed(f)) if f.message == "card declined"),
        "{replayed:?}"
    );
    server.stop().await;
}

/// A step journaled through the API is not run again by a later attempt
/// of the same record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_are_journaled_through_the_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = Server::start(dir.path().join("idem.db")).await;
    let idem = Idempotency::builder(server.store())
        .build()
        .expect("executor");
    let charged = Arc::new(AtomicU32::new(0));
    for attempt in 1..=2 {
        let charged = charged.clone();
        let run = idem
            .run(&id("steps"), None, |ctx| async move {
                let receipt: String = ctx
                    .step("charge", Retry, |_| async {
                        charged.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Io>("rcpt-1".to_owned())
                    })
                    .await?;
                if attempt == 1 {
                    return Err(HandlerError::new(Io::other("shipping is down")));
                }
                Ok(format!("{receipt} shipped"))
            })
            .await;
        match (attempt, run) {
            (
                1,
                Err(RunError::Handler {
                    class: FailureClass::Retryable,
                    ..
                }),
            ) => {}
            (
                2,
                Ok(Outcome::Executed {
                    value, attempt: 2, ..
                }),
            ) => assert_eq!(value, "rcpt-1 shipped"),
            (n, other) => panic!("attempt {n}: {other:?}"),
        }
    }
    assert_eq!(charged.load(Ordering::SeqCst), 1);
    server.stop().await;
}

/// `idem serve` goes away for 2 s while a finished run's completion is
/// being sent: the executor keeps sending it (within the lease) until the
/// server is back, the run is stored once, and the next claim replays it.
/// (The Python and TypeScript clients this replaces gave up after 1 to 4
/// s and left the claim to be taken over and run again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_waits_out_a_restart_of_idem_serve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path().join("idem.db")).await;
    let store = server.store();
    let server = Arc::new(tokio::sync::Mutex::new(server));
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(10))
        .build()
        .expect("executor");
    let runs = AtomicU32::new(0);
    let started = Instant::now();
    let restarted = {
        let server = server.clone();
        let key = id("restart");
        let run = idem.run(&key, None, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            server.lock().await.stop().await;
            Ok::<_, Io>("shipped".to_owned())
        });
        let back = async {
            // Wait until the run has stopped the server, then 2 s more.
            while server.lock().await.task.is_some() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            server.lock().await.start_again().await;
        };
        let (run, ()) = tokio::join!(run, back);
        run
    };
    assert!(
        matches!(&restarted, Ok(Outcome::Executed { value, .. }) if value == "shipped"),
        "{restarted:?}"
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    let store = server.lock().await.store();
    let fresh = Idempotency::builder(store).build().expect("executor");
    let again = fresh
        .run(&id("restart"), None, |_| async {
            Ok::<_, Io>("ran twice".to_owned())
        })
        .await;
    assert_eq!(
        again.expect("replayed"),
        Outcome::Replayed {
            value: "shipped".to_owned()
        }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.lock().await.stop().await;
}

/// What the store answers when `idem serve` is not there or refuses the
/// caller: no answer is transient (the executor fails closed, nothing
/// runs); a wrong token is a refusal that names the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_away_fails_closed_and_a_wrong_token_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = Server::start(dir.path().join("idem.db")).await;
    let wrong = RemoteStore::builder(&format!("http://:not-a-token@{}", server.addr))
        .expect("url")
        .build()
        .expect("store");
    let refused = Idempotency::builder(wrong)
        .build()
        .expect("executor")
        .run(&id("wrong-token"), None, |_| async { Ok::<_, Io>(()) })
        .await;
    match &refused {
        Err(RunError::Store(error)) => {
            assert!(error.is_refusal(), "{error:?}");
            assert!(idem::error_chain(error).contains("401"), "{error}");
        }
        other => panic!("{other:?}"),
    }

    let store = server.store();
    server.stop().await;
    let ran = AtomicU32::new(0);
    let away = Idempotency::builder(store)
        .build()
        .expect("executor")
        .run(&id("away"), None, |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Io>(())
        })
        .await;
    assert!(
        matches!(
            &away,
            Err(RunError::Store(idem::StoreError::Unavailable(_)))
        ),
        "{away:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "fail closed");
}

/// The server's lease in the outbox tests: how long a message whose send
/// failed waits before a replay or a dispatcher sends it again.
const SERVER_LEASE: Duration = Duration::from_millis(400);

fn short_lease(config: &mut ServeConfig) {
    config.lease = SERVER_LEASE;
}

/// Waits up to `within` for `sender` to hold `n` messages; their ids.
async fn sent(sender: &MemorySender, n: usize, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    while sender.messages().len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sender
        .messages()
        .iter()
        .map(|m| m.id().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_over_idem_serve_send_through_the_servers_outbox_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = MemorySender::new();
    let outbox = ServeOutbox {
        url: "memory://".to_owned(),
        sender: Arc::new(broker.clone()),
    };
    let mut server = Server::with(dir.path().join("idem.db"), short_lease, Some(outbox)).await;
    let idem = Idempotency::builder(server.store())
        .outbox_sent_by_store()
        .build()
        .expect("executor");

    let runs = Arc::new(AtomicU32::new(0));
    let charged = Message::new("order-events", r#"{"charged":"order-7"}"#).header("tenant", "a");
    let shipped = Message::new("order-events", "shipped");
    let expected = vec![charged.id().to_owned(), shipped.id().to_owned()];
    for _ in 0..3 {
        let (runs, charged, shipped) = (runs.clone(), charged.clone(), shipped.clone());
        let outcome = idem
            .run(&id("order-7"), None, |ctx| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                ctx.send(charged)?;
                ctx.send(shipped)?;
                Ok::<_, HandlerError>("charged".to_owned())
            })
            .await
            .expect("run, then replayed");
        assert!(matches!(
            outcome,
            Outcome::Executed { .. } | Outcome::Replayed { .. }
        ));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(sent(&broker, 2, Duration::from_secs(5)).await, expected);
    let first = &broker.messages()[0];
    assert_eq!(first.payload().as_ref(), br#"{"charged":"order-7"}"#);
    assert_eq!(first.headers(), [("tenant".to_owned(), "a".to_owned())]);

    // The broker is away when the next run completes: the completion is
    // stored with its message all the same, and once the broker is back
    // a duplicate (or the server's dispatcher) sends it, once.
    broker.fail(true);
    let refunded = Message::new("order-events", "refunded");
    let refund_id = refunded.id().to_owned();
    idem.run(&id("order-8"), None, |ctx| async move {
        ctx.send(refunded)?;
        Ok::<_, HandlerError>("refunded".to_owned())
    })
    .await
    .expect("completes with the broker away");
    // Past the server's three tries (at 0, 50 and 250 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(broker.messages().len(), 2, "nothing more was confirmed");
    broker.fail(false);
    tokio::time::sleep(SERVER_LEASE + Duration::from_millis(100)).await;
    let replayed = idem
        .run(&id("order-8"), None, |_| async {
            Ok::<_, HandlerError>("ran twice".to_owned())
        })
        .await
        .expect("replayed");
    assert_eq!(
        replayed,
        Outcome::Replayed {
            value: "refunded".to_owned()
        }
    );
    let ids = sent(&broker, 3, Duration::from_secs(8)).await;
    assert_eq!(ids[2..], [refund_id]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(broker.messages().len(), 3, "sent once");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_outbox_idem_serve_leaves_runs_messages_to_a_dispatcher_over_its_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("idem.db");
    let mut server = Server::with(file.clone(), short_lease, None).await;
    let idem = Idempotency::builder(server.store())
        .outbox_sent_by_store()
        .build()
        .expect("executor");
    let message = Message::new("order-events", "charged");
    let expected = vec![message.id().to_owned()];
    idem.run(&id("order-9"), None, |ctx| async move {
        ctx.send(message)?;
        Ok::<_, HandlerError>(serde_json::json!({"charge": "ch_9"}))
    })
    .await
    .expect("completes");
    // The record reads as the JSON the run returned.
    let replayed = Idempotency::builder(server.store())
        .build()
        .expect("executor")
        .run(&id("order-9"), None, |_| async {
            Ok::<_, HandlerError>(serde_json::Value::Null)
        })
        .await
        .expect("replayed");
    assert_eq!(
        replayed,
        Outcome::Replayed {
            value: serde_json::json!({"charge": "ch_9"})
        }
    );

    // What `idem outbox run` does, over the server's store.
    let broker = MemorySender::new();
    let dispatcher = Idempotency::builder(SqliteStore::open(&file).expect("open"))
        .outbox(broker.clone())
        .build()
        .expect("a dispatcher");
    tokio::time::sleep(SERVER_LEASE + Duration::from_millis(100)).await;
    let pass = dispatcher.dispatch_pending().await.expect("a pass");
    assert_eq!((pass.runs, pass.messages), (1, 1), "{pass:?}");
    assert_eq!(sent(&broker, 1, Duration::ZERO).await, expected);
    let pass = dispatcher.dispatch_pending().await.expect("a pass");
    assert_eq!(pass.messages, 0, "sent once: {pass:?}");
    server.stop().await;
}
