//! PostgreSQL going away under load: typed errors while it is down,
//! automatic recovery when it is back, and no acknowledged completion lost
//! across the crash. Uses a server of its own, since it crashes it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem::{ClaimOutcome, ClaimParams, GetRecord, RecordId, State, Store, StoreError};
use idem_postgres::{ConnectError, PgStore};
use idem_testkit::postgres::PgServer;
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
