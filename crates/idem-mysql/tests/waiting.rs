//! A duplicate waiting for an in-flight run, in another process's store:
//! MySQL has no notifications, so the wait polls the record's state (5 ms
//! doubling to 200 ms). The duplicate gets the first run's outcome within
//! one poll of its landing, and the handler runs once.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{Idempotency, Outcome, RecordId};
use idem_mysql::MySqlStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_gets_the_outcome_within_one_poll_of_its_landing() {
    let url = common::url("wait");
    let connect = || async {
        MySqlStore::builder(&url)
            .expect("valid URL")
            .pool_size(4)
            .connect()
            .await
            .expect("connect")
    };
    let running = Idempotency::builder(connect().await)
        .build()
        .expect("executor");
    let waiting = Idempotency::builder(connect().await)
        .wait_for_in_flight(Duration::from_secs(20))
        .build()
        .expect("executor");
    let runs = Arc::new(AtomicUsize::new(0));
    let mut late = Vec::new();
    for n in 0..4 {
        let id = RecordId::parse("orders", &format!("w-{n}")).expect("valid");
        let (started, start) = tokio::sync::oneshot::channel();
        let first = tokio::spawn({
            let (running, id, runs) = (running.clone(), id.clone(), runs.clone());
            async move {
                let outcome = running
                    .run(&id, None, |_| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let _ = started.send(());
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        Ok::<_, std::io::Error>("shipped".to_owned())
                    })
                    .await;
                assert!(
                    matches!(outcome, Ok(Outcome::Executed { .. })),
                    "{outcome:?}"
                );
                Instant::now()
            }
        });
        start.await.expect("handler started");
        let runs = runs.clone();
        let outcome = waiting
            .run(&id, None, |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>("twice".to_owned())
            })
            .await
            .expect("outcome");
        let woke = Instant::now();
        assert!(
            matches!(outcome, Outcome::Replayed { ref value } if value == "shipped"),
            "{outcome:?}"
        );
        late.push(woke.saturating_duration_since(first.await.expect("run")));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4, "each handler ran once");
    assert!(
        late.iter().all(|l| *l < Duration::from_millis(300)),
        "found this long after each outcome landed: {late:?}"
    );
}
