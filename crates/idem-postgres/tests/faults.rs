//! PostgreSQL going away under load: typed errors while it is down,
//! automatic recovery when it is back, and no acknowledged completion lost
//! across the crash. Uses a server of its own, since it crashes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{GetRecord, RecordId, State, Store, StoreError};
use idem_postgres::{ConnectError, PgStore};
use idem_testkit::servers::postgres::PgServer;
use parking_lot::Mutex;

const LEASE: Duration = Duration::from_secs(30);
const KEEP: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_mid_run_loses_no_acknowledged_completion() {
    let mut server = PgServer::start().expect("start postgres");
    let store = PgStore::builder(&server.url("postgres"))
        .expect("url")
        .schema("crash")
        .pool_size(8)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    let acknowledged: Arc<Mutex<HashMap<RecordId, Bytes>>> = Arc::default();
    let unavailable = Arc::new(Mutex::new(0usize));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (store, acknowledged, unavailable, stop) = (
                store.clone(),
                acknowledged.clone(),
                unavailable.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let p = ClaimParams::new(LEASE, KEEP);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = RecordId::parse("crash", &format!("w{w}-{n}")).expect("id");
                    let body = Bytes::from(format!("done {w}/{n}"));
                    let result = async {
                        match store.claim(&id, &p).await? {
                            ClaimOutcome::Acquired(lease) => {
                                store.complete(&lease, body.clone(), KEEP).await
                            }
                            other => panic!("fresh key {id} answered {other:?}"),
                        }
                    }
                    .await;
                    match result {
                        Ok(()) => {
                            acknowledged.lock().insert(id, body);
                        }
                        Err(StoreError::Unavailable(_)) => {
                            *unavailable.lock() += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("unexpected error for {id}: {e:?}"),
                    }
                }
            })
        })
        .collect();

    tokio::time::sleep(Duration::from_millis(700)).await;
    let before_crash = acknowledged.lock().len();
    let server = tokio::task::spawn_blocking(move || {
        server.crash();
        std::thread::sleep(Duration::from_millis(700));
        server.start_again().expect("restart");
        server
    })
    .await
    .expect("restart task");
    let restarted = acknowledged.lock().len();
    // Recovery: completions resume on their own once the server is back.
    let deadline = Instant::now() + Duration::from_secs(20);
    while acknowledged.lock().len() < restarted + 200 {
        assert!(Instant::now() < deadline, "the store did not recover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }

    let acknowledged = acknowledged.lock().clone();
    assert!(before_crash > 0, "work was done before the crash");
    assert!(
        *unavailable.lock() > 0,
        "the outage was seen as Unavailable"
    );
    for (id, body) in &acknowledged {
        let record = store
            .get(id)
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("acknowledged completion of {id} lost in the crash"));
        assert_eq!(
            record.state,
            State::Completed {
                response: body.clone()
            },
            "{id}"
        );
    }
    drop(server);
}

#[tokio::test]
async fn connecting_to_nothing_gives_a_typed_error_without_the_password() {
    let port = idem_testkit::free_port().expect("port");
    let err = PgStore::builder(&format!("postgres://app:secret@127.0.0.1:{port}/db"))
        .expect("url")
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect_err("nothing listens there");
    assert!(matches!(err, ConnectError::Unavailable { .. }), "{err:?}");
    assert!(!err.to_string().contains("secret"), "{err}");
}

/// A duplicate waiting through a crash: the end of the listening
/// connection wakes it (it does not sleep out its wait), and its next wait
/// listens again on a new connection, so the outcome that lands after the
/// restart wakes it at once, not at the next safety-net read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_listens_again_after_a_crash() {
    let mut server = PgServer::start().expect("start postgres");
    let connect = || async {
        PgStore::builder(&server.url("postgres"))
            .expect("url")
            .schema("waits")
            .pool_size(2)
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .expect("connect")
    };
    let (running, waiting) = (connect().await, Arc::new(connect().await));
    let id = RecordId::parse("orders", "through-a-crash").expect("id");
    let ClaimOutcome::Acquired(lease) = running
        .claim(&id, &ClaimParams::new(LEASE, KEEP))
        .await
        .expect("claim")
    else {
        panic!("a fresh key is acquired");
    };
    let wait = |timeout| {
        let (waiting, id) = (Arc::clone(&waiting), id.clone());
        tokio::spawn(async move {
            waiting.wait_for_change(&id, timeout).await;
            Instant::now()
        })
    };
    let first = wait(Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crashed_at = Instant::now();
    let server = tokio::task::spawn_blocking(move || {
        server.crash();
        server.start_again().expect("restart");
        server
    })
    .await
    .expect("restart task");
    let woken = first.await.expect("first wait");
    assert!(
        woken.saturating_duration_since(crashed_at) < Duration::from_secs(10),
        "the connection's end woke the wait"
    );

    let second = wait(Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!second.is_finished(), "still in progress: the wait goes on");
    let listening = server
        .psql(
            "postgres",
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN idem_done'",
        )
        .expect("psql");
    assert_eq!(listening, "1", "the waiting store listens again");
    let deadline = Instant::now() + Duration::from_secs(20);
    let landed = loop {
        match running.complete(&lease, Bytes::from("shipped"), KEEP).await {
            Ok(()) => break Instant::now(),
            Err(StoreError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("complete after the restart: {e:?}"),
        }
    };
    let late = second
        .await
        .expect("second wait")
        .saturating_duration_since(landed);
    assert!(
        late < Duration::from_millis(300),
        "woken {late:?} after the outcome landed (the safety net reads each second)"
    );
    drop(server);
}
