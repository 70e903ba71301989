//! A duplicate waiting for an in-flight run on the same file, when that
//! run is another store's (another process's): woken through the file's
//! change counter soon after the outcome is committed, not at the end of
//! its wait.

use std::time::{Duration, Instant};

use idem::{Idempotency, Outcome, RecordId};
use idem_sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_sees_another_stores_outcome_soon_after_it_lands() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("idem.db");
    // Two stores on one file: each has its own writer, so neither's
    // in-process notification reaches the other, as with two processes.
    let running = Idempotency::builder(SqliteStore::open(&path).expect("open"))
        .build()
        .expect("executor");
    let waiting = Idempotency::builder(SqliteStore::open(&path).expect("open"))
        .wait_for_in_flight(Duration::from_secs(20))
        .build()
        .expect("executor");
    let id = RecordId::parse("orders", "elsewhere").expect("valid");
    let (started, start) = tokio::sync::oneshot::channel();
    let first = {
        let id = id.clone();
        tokio::spawn(async move {
            let outcome = running
                .run(&id, None, |_| async move {
                    let _ = started.send(());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, std::io::Error>("shipped".to_owned())
                })
                .await;
            (outcome, Instant::now())
        })
    };
    start.await.expect("handler started");
    let outcome = waiting
        .run(&id, None, |_| async {
            Ok::<_, std::io::Error>("twice".to_owned())
        })
        .await
        .expect("outcome");
    let woke = Instant::now();
    assert!(
        matches!(outcome, Outcome::Replayed { ref value } if value == "shipped"),
        "{outcome:?}"
    );
    let (executed, landed) = first.await.expect("task");
    assert!(matches!(executed, Ok(Outcome::Executed { .. })));
    let late = woke.saturating_duration_since(landed);
    assert!(
        late < Duration::from_millis(300),
        "woken {late:?} after the other store's outcome landed"
    );
}
