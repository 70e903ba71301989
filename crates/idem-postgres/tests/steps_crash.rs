//! Journaled steps survive a worker killed anywhere, and the completer
//! finishes what the killed workers left (docs/design.md §7).
//!
//! An order handler over real services: it reserves stock (a write to
//! PostgreSQL, keyed by the step's downstream key), charges through a
//! payment provider started by this test (an HTTP server that honours
//! `Idempotency-Key` and counts charges) and sends a notification
//! (another HTTP server, which counts every request). It is a durable
//! handler: one worker process per order runs it and is killed with
//! SIGKILL (`Child::kill`, by PID) at a step boundary or inside a step.
//! Nobody retries the orders; a completer sweeping the store takes over
//! every abandoned one with its journaled input. The test asserts exactly
//! one charge and one reservation per order, the notification count its
//! policy promises (at least once for `Retry`, at most once for `Skip`,
//! parked for `Park`), every order completed or parked, and parked orders
//! completed by their next delivery after `resolve_step`.
//!
//! The worker processes are this test binary run again in a child mode
//! (the ignored `child` test, selected by an environment variable).

mod common;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use idem::durable::{Completer, Durable, Sweep};
use idem::step::{Park, Retry, Skip, StepCtx, StepError};
use idem::{
    Context, GetRecord, Idempotency, Key, ListQuery, ListRecords, Outcome, RecordId, Resolution,
    Scope, StateKind, StepJournal,
};
use idem_postgres::PgStore;
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const CHILD: &str = "IDEM_STEPS_CHILD";
const SCOPE: &str = "orders";
const POLICIES: [&str; 3] = ["retry", "skip", "park"];
/// Where a worker is killed: before each step, inside each step (marked
/// started, effect not done yet; effect done, result not journaled yet),
/// and after the last step before the outcome is stored.
const KILL_POINTS: [&str; 10] = [
    "before:reserve",
    "start:reserve",
    "done:reserve",
    "before:charge",
    "start:charge",
    "done:charge",
    "before:notify",
    "start:notify",
    "done:notify",
    "end",
];

/// What a worker needs to reach the services.
#[derive(Debug, Clone)]
struct Services {
    db_url: String,
    schema: String,
    payments: SocketAddr,
    notifications: SocketAddr,
}

impl Services {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).expect("set by the parent");
        Self {
            db_url: var("IDEM_STEPS_DB"),
            schema: var("IDEM_STEPS_SCHEMA"),
            payments: var("IDEM_STEPS_PAY").parse().expect("address"),
            notifications: var("IDEM_STEPS_NOTIFY").parse().expect("address"),
        }
    }

    async fn idem(&self) -> Idempotency<PgStore> {
        let store = PgStore::builder(&self.db_url)
            .expect("url")
            .schema(&self.schema)
            .pool_size(4)
            .connect()
            .await
            .expect("connect the store");
        Idempotency::builder(store)
            .lease(Duration::from_millis(1500))
            .heartbeat(Duration::from_millis(300))
            .build()
            .expect("config")
    }
}

/// The order handler as a durable handler: its input is the order and the
/// notification policy.
type Orders = Durable<PgStore, (String, String), String, OrderError>;

fn orders(idem: &Idempotency<PgStore>, services: Arc<Services>, kill_at: Option<String>) -> Orders {
    idem.durable(
        Scope::new(SCOPE).expect("valid"),
        move |(order, policy): (String, String), ctx: Context| {
            let services = Arc::clone(&services);
            let kill_at = kill_at.clone();
            async move { handle_order(ctx, &services, &order, &policy, kill_at.as_deref()).await }
        },
    )
    .expect("PostgreSQL keeps a step journal")
}

#[derive(Debug, thiserror::Error)]
enum OrderError {
    #[error(transparent)]
    Step(#[from] StepError<io::Error>),
}

/// The worker's order handler. `kill_at` is where a doomed worker stops
/// (it prints the point and waits to be killed).
async fn handle_order(
    ctx: Context,
    services: &Services,
    order: &str,
    policy: &str,
    kill_at: Option<&str>,
) -> Result<String, OrderError> {
    let at = |point: &'static str| checkpoint(kill_at, point, order);
    at("before:reserve").await;
    ctx.step("reserve", Retry, |s| async move {
        at("start:reserve").await;
        reserve(services, order, &s).await?;
        at("done:reserve").await;
        Ok::<_, io::Error>(())
    })
    .await?;
    at("before:charge").await;
    let charge: String = ctx
        .step("charge", Retry, |s| async move {
            at("start:charge").await;
            let id = http_post(services.payments, "/charges", s.key(), order).await?;
            at("done:charge").await;
            Ok::<_, io::Error>(id)
        })
        .await?;
    at("before:notify").await;
    let notify = |s: StepCtx| async move {
        at("start:notify").await;
        http_post(services.notifications, "/notify", s.key(), order).await?;
        at("done:notify").await;
        Ok::<_, io::Error>(())
    };
    let notified = match policy {
        "retry" => ctx.step("notify", Retry, notify).await.map(|()| true)?,
        "skip" => ctx.step("notify", Skip, notify).await?.is_some(),
        _ => ctx.step("notify", Park, notify).await.map(|()| true)?,
    };
    at("end").await;
    Ok(format!("{charge} notified={notified}"))
}

/// In a doomed worker, at its kill point: report it and wait for SIGKILL.
#[allow(clippy::print_stdout)]
async fn checkpoint(kill_at: Option<&str>, point: &str, order: &str) {
    if kill_at == Some(point) {
        println!("AT {point} {order}");
        std::future::pending::<()>().await;
    }
}

/// Reserves stock for `order` once per downstream key: a repeated step
/// finds its row and writes nothing.
async fn reserve(services: &Services, order: &str, step: &StepCtx) -> io::Result<()> {
    let (client, connection) = tokio_postgres::connect(&services.db_url, tokio_postgres::NoTls)
        .await
        .map_err(io::Error::other)?;
    let driver = tokio::spawn(connection);
    let sql = format!(
        "INSERT INTO {}.reservations (step_key, order_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        services.schema
    );
    let written = client
        .execute(&sql, &[&step.key(), &order])
        .await
        .map_err(io::Error::other);
    drop(client);
    let _ = driver.await;
    written.map(drop)
}

/// A minimal HTTP/1.1 POST; the response body on 200.
async fn http_post(addr: SocketAddr, path: &str, key: &str, body: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nIdempotency-Key: {key}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    if !response.starts_with("HTTP/1.1 200") {
        return Err(io::Error::other(format!("{path} answered {response:?}")));
    }
    Ok(response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned())
}

/// The payment provider: one charge per `Idempotency-Key`, replayed for a
/// repeated key; counts charges per order.
#[derive(Debug, Default)]
struct Payments {
    by_key: HashMap<String, String>,
    charges_per_order: HashMap<String, u32>,
}

async fn charge(
    State(payments): State<Arc<Mutex<Payments>>>,
    headers: HeaderMap,
    order: String,
) -> Result<String, StatusCode> {
    let key = headers
        .get("idempotency-key")
        .and_then(|k| k.to_str().ok())
        .ok_or(StatusCode::BAD_REQUEST)?
        .to_owned();
    let mut p = payments.lock();
    if let Some(id) = p.by_key.get(&key) {
        return Ok(id.clone());
    }
    let id = format!("ch_{}", p.by_key.len() + 1);
    p.by_key.insert(key, id.clone());
    *p.charges_per_order.entry(order).or_default() += 1;
    Ok(id)
}

async fn notify(State(sent): State<Arc<Mutex<HashMap<String, u32>>>>, order: String) {
    *sent.lock().entry(order).or_default() += 1;
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

fn order_id(policy: &str, point: &str) -> String {
    format!("order-{policy}-{}", point.replace(':', "-"))
}

/// Sweeps until no order is left in progress; returns the sweeps' sum.
async fn complete_abandoned(idem: &Idempotency<PgStore>, completer: &Completer) -> Sweep {
    let scope = Scope::new(SCOPE).expect("valid");
    let mut total = Sweep::default();
    for _ in 0..200 {
        total += completer.sweep().await;
        let running = idem
            .store()
            .list(
                &ListQuery::new(100)
                    .scope(scope.clone())
                    .state(StateKind::InProgress),
            )
            .await
            .expect("list");
        if running.records.is_empty() {
            return total;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("orders still in progress after 40 s of sweeps: {total:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_anywhere_charges_once_and_loses_no_order() {
    let schema = format!("steps_{:016x}", rand::random::<u64>());
    let payments_state = Arc::new(Mutex::new(Payments::default()));
    let sent: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let services = Services {
        db_url: common::url(),
        schema: schema.clone(),
        payments: serve(
            Router::new()
                .route("/charges", post(charge))
                .with_state(Arc::clone(&payments_state)),
        )
        .await,
        notifications: serve(
            Router::new()
                .route("/notify", post(notify))
                .with_state(Arc::clone(&sent)),
        )
        .await,
    };
    let idem = services.idem().await;
    let (client, connection) = tokio_postgres::connect(&services.db_url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.reservations (step_key text PRIMARY KEY, order_id text NOT NULL)"
        ))
        .await
        .expect("business table");

    for policy in POLICIES {
        for point in KILL_POINTS {
            let order = order_id(policy, point);
            let mut child = tokio::process::Command::new(std::env::current_exe().expect("exe"))
                .args(idem_testkit::rerun::only_ignored("child"))
                .env(CHILD, "1")
                .env("IDEM_STEPS_DB", &services.db_url)
                .env("IDEM_STEPS_SCHEMA", &schema)
                .env("IDEM_STEPS_PAY", services.payments.to_string())
                .env("IDEM_STEPS_NOTIFY", services.notifications.to_string())
                .env("IDEM_STEPS_ORDER", &order)
                .env("IDEM_STEPS_POLICY", policy)
                .env("IDEM_STEPS_KILL_AT", point)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn worker");
            let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
            let want = format!("AT {point} {order}");
            let mut seen = Vec::new();
            let reached = tokio::time::timeout(Duration::from_secs(30), async {
                while let Some(line) = lines.next_line().await.expect("read") {
                    // The harness prints `test child ... ` before it.
                    if line.ends_with(&want) {
                        return true;
                    }
                    seen.push(line);
                }
                false
            })
            .await
            .unwrap_or(false);
            child.kill().await.expect("SIGKILL the worker");
            assert!(
                reached,
                "worker for {order} never reached {point}; it said {seen:?}"
            );
        }
    }

    // Nobody retries: a completer finds every order whose worker died and
    // finishes it with its journaled input.
    let durable = orders(&idem, Arc::new(services.clone()), None);
    let completer = Completer::new().register(&durable).concurrency(8);
    let swept = complete_abandoned(&idem, &completer).await;
    let total = POLICIES.len() * KILL_POINTS.len();
    assert_eq!(
        (swept.found, swept.completed, swept.parked),
        (total, total - 2, 2),
        "every order re-driven once; the two Park orders in doubt parked: {swept:?}"
    );
    assert_eq!(
        (swept.failed, swept.released, swept.errors),
        (0, 0, 0),
        "{swept:?}"
    );
    let mut parked = Vec::new();
    let mut outcomes = Vec::new();
    for policy in POLICIES {
        for point in KILL_POINTS {
            let order = order_id(policy, point);
            let id = RecordId::parse(SCOPE, &order).expect("valid");
            let record = idem.store().get(&id).await.expect("get").expect("present");
            let completed = match &record.state {
                idem::State::Completed { .. } => true,
                idem::State::Failed { failure } if failure.is_parked() => false,
                other => panic!("{order} ended {other:?}"),
            };
            outcomes.push((order, policy, point, completed));
        }
    }
    for (order, policy, point, completed) in &outcomes {
        let in_notify = point.ends_with(":notify") && !point.starts_with("before");
        assert_eq!(
            *completed,
            !(*policy == "park" && in_notify),
            "{order}: only a Park step found in doubt parks its order"
        );
        if !completed {
            parked.push((order.clone(), *point));
        }
    }
    let count_sent = |order: &str| sent.lock().get(order).copied().unwrap_or(0);
    for (order, policy, point, _) in &outcomes {
        let want = match (*policy, *point) {
            ("retry", "done:notify") => 2,
            (_, "start:notify") => u32::from(*policy == "retry"),
            _ => 1,
        };
        assert_eq!(
            count_sent(order),
            want,
            "{order}: notifications under {policy}"
        );
    }
    assert_eq!(parked.len(), 2, "{parked:?}");

    // An operator checks the notification service and resolves each
    // parked order; the next delivery completes it without re-running
    // the finished steps.
    for (order, point) in &parked {
        let id = RecordId::parse(SCOPE, order).expect("valid");
        let resolution = if count_sent(order) == 1 {
            Resolution::Applied(Bytes::from_static(b"null"))
        } else {
            Resolution::NotApplied
        };
        assert_eq!(
            idem.store()
                .resolve_step(&id, "notify", resolution)
                .await
                .expect("resolve"),
            idem::Resolved::Released,
            "{order} parked at {point}"
        );
        let next = durable
            .run(
                &Key::new(order).expect("valid"),
                (order.clone(), "park".into()),
            )
            .await
            .expect("the next delivery completes it");
        assert!(
            matches!(next, Outcome::Executed { .. }),
            "{order}: {next:?}"
        );
        assert_eq!(
            count_sent(order),
            1,
            "{order}: exactly one notification after resolving"
        );
    }

    let reservations: Vec<(String, i64)> = client
        .query(
            &format!("SELECT order_id, count(*) FROM {schema}.reservations GROUP BY order_id"),
            &[],
        )
        .await
        .expect("count reservations")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        reservations.len(),
        outcomes.len(),
        "every order reserved stock"
    );
    let payments = payments_state.lock();
    for (order, _, _, _) in &outcomes {
        assert_eq!(
            payments.charges_per_order.get(order),
            Some(&1),
            "{order}: exactly one charge"
        );
        assert!(
            reservations.contains(&(order.clone(), 1)),
            "{order}: stock reserved exactly once: {reservations:?}"
        );
    }
}

/// The worker process: runs one order and is killed at its kill point.
#[test]
#[ignore = "child process of the kill test"]
fn child() {
    if std::env::var(CHILD).is_err() {
        return;
    }
    let services = Services::from_env();
    let var = |name: &str| std::env::var(name).expect("set by the parent");
    let (order, policy, kill_at) = (
        var("IDEM_STEPS_ORDER"),
        var("IDEM_STEPS_POLICY"),
        var("IDEM_STEPS_KILL_AT"),
    );
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            let idem = services.idem().await;
            let key = Key::new(&order).expect("valid");
            let result = orders(&idem, Arc::new(services), Some(kill_at.clone()))
                .run(&key, (order.clone(), policy))
                .await;
            panic!("the worker for {order} was to be killed at {kill_at}, and ended: {result:?}");
        });
}
