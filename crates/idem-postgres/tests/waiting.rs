//! A duplicate waiting for an in-flight run is woken by PostgreSQL's
//! LISTEN/NOTIFY: the write that ends a record somebody waits on announces
//! it on `idem_done`, and only then (the writes that end records nobody
//! waits on send nothing: a NOTIFY serializes committing transactions).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{DeleteRecord, Idempotency, Outcome, RecordId, Store};
use idem_postgres::PgStore;
use tokio_postgres::AsyncMessage;

/// A second store on `store`'s schema, with a pool and a listening
/// connection of its own, as another process would have.
async fn elsewhere(store: &PgStore) -> PgStore {
    PgStore::builder(&common::url())
        .expect("valid URL")
        .schema(store.schema())
        .pool_size(4)
        .connect()
        .await
        .expect("connect")
}

/// Every announcement on `idem_done` for `schema` from now on (other tests
/// announce too), as `(channel, payload)`, while the client it returns
/// lives.
async fn announcements(
    schema: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) {
    let (client, mut connection) = tokio_postgres::connect(&common::url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let ours = format!("{schema}:");
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                AsyncMessage::Notification(n) if n.payload().starts_with(&ours) => {
                    let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
                }
                _ => {}
            }
        }
    });
    client
        .batch_execute("LISTEN idem_done")
        .await
        .expect("listen");
    (client, rx)
}

/// Runs `handler_time` of work on `key` in `running`; the time its
/// outcome landed.
fn slow_run(
    running: &Idempotency<PgStore>,
    id: &RecordId,
    handler_time: Duration,
) -> (
    tokio::sync::oneshot::Receiver<()>,
    tokio::task::JoinHandle<Instant>,
) {
    let (started, start) = tokio::sync::oneshot::channel();
    let (running, id) = (running.clone(), id.clone());
    let task = tokio::spawn(async move {
        let outcome = running
            .run(&id, None, |_| async move {
                let _ = started.send(());
                tokio::time::sleep(handler_time).await;
                Ok::<_, std::io::Error>("shipped".to_owned())
            })
            .await;
        assert!(
            matches!(outcome, Ok(Outcome::Executed { .. })),
            "{outcome:?}"
        );
        Instant::now()
    });
    (start, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_in_another_process_are_woken_as_each_outcome_lands() {
    let store = common::store("wake").await;
    let running = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let waiting = Idempotency::builder(elsewhere(&store).await)
        .wait_for_in_flight(Duration::from_secs(20))
        .build()
        .expect("executor");
    // Polling (5 ms doubling to 200 ms) finds an outcome on average about
    // 100 ms after it lands; eight waits all within 100 ms would be luck.
    let keys = 8;
    let mut waits = Vec::new();
    for n in 0..keys {
        let id = RecordId::parse("orders", &format!("w-{n}")).expect("valid");
        let (start, landed) = slow_run(&running, &id, Duration::from_millis(800));
        start.await.expect("handler started");
        let waiting = waiting.clone();
        waits.push(tokio::spawn(async move {
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
            woke.saturating_duration_since(landed.await.expect("run"))
        }));
    }
    let mut late = Vec::new();
    for wait in waits {
        late.push(wait.await.expect("wait"));
    }
    assert!(
        late.iter().all(|l| *l < Duration::from_millis(100)),
        "woken this long after each outcome landed: {late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_end_of_a_waited_record_is_announced() {
    let store = common::store("announce").await;
    let (_listening, mut heard) = announcements(store.schema()).await;
    let running = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let unwaited = RecordId::parse("orders", "nobody-waits").expect("valid");
    running
        .run(&unwaited, None, |_| async {
            Ok::<_, std::io::Error>("quiet".to_owned())
        })
        .await
        .expect("executed");

    let waited = RecordId::parse("orders", "somebody-waits").expect("valid");
    let (start, landed) = slow_run(&running, &waited, Duration::from_millis(300));
    start.await.expect("handler started");
    let other = elsewhere(&store).await;
    other
        .wait_for_change(&waited, Duration::from_secs(10))
        .await;
    landed.await.expect("run");

    let (channel, payload) = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .expect("an announcement")
        .expect("listening");
    assert_eq!(channel, "idem_done");
    let (schema, digest) = payload.split_once(':').expect("schema:digest");
    assert_eq!(schema, store.schema());
    assert_eq!(
        digest.len(),
        64,
        "a SHA-256 of the id, not the id: {payload}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), heard.recv())
            .await
            .is_err(),
        "one announcement, for the waited record only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_wakes_the_waiters_of_the_record() {
    let store = common::store("deleted").await;
    let (_listening, mut heard) = announcements(store.schema()).await;
    let running = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let id = RecordId::parse("orders", "force-released").expect("valid");
    let (start, landed) = slow_run(&running, &id, Duration::from_secs(30));
    start.await.expect("handler started");
    let other = Arc::new(elsewhere(&store).await);
    let wait = {
        let (other, id) = (Arc::clone(&other), id.clone());
        tokio::spawn(async move {
            other.wait_for_change(&id, Duration::from_secs(20)).await;
            Instant::now()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deleted_at = Instant::now();
    assert!(store.delete(&id).await.expect("delete"));
    let late = wait
        .await
        .expect("wait")
        .saturating_duration_since(deleted_at);
    assert!(
        late < Duration::from_millis(500),
        "woken {late:?} after the delete"
    );
    let announced = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert!(
        matches!(announced, Ok(Some((ref channel, _))) if channel == "idem_done"),
        "the delete is announced: {announced:?}"
    );
    landed.abort();
}
