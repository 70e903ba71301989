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

/// With `listen=false` (PgBouncer in transaction mode) a store opens no
/// listening connection, and its waits poll: the duplicate still gets the
/// outcome within the poll's 200 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listening_waits_poll() {
    let store = common::store("nolisten").await;
    let name = format!("nolisten_{:08x}", rand::random::<u32>());
    let polling = PgStore::builder(&format!(
        "{}?listen=false&application_name={name}",
        common::url()
    ))
    .expect("valid URL")
    .schema(store.schema())
    .connect()
    .await
    .expect("connect");
    let running = Idempotency::builder(store).build().expect("executor");
    let id = RecordId::parse("orders", "polled").expect("valid");
    let (start, landed) = slow_run(&running, &id, Duration::from_millis(600));
    start.await.expect("handler started");
    polling.wait_for_change(&id, Duration::from_secs(10)).await;
    let late = Instant::now().saturating_duration_since(landed.await.expect("run"));
    assert!(late < Duration::from_millis(250), "woken {late:?} late");
    let (server, db) = common::server();
    let listening = server
        .psql(
            db,
            &format!(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = '{name}' AND query LIKE 'LISTEN%'"
            ),
        )
        .expect("psql");
    assert_eq!(listening, "0", "no listening connection");
}

/// A schema without migration 0006 (a team that applies migrations with
/// its own tool and has not run the new one yet) still completes, fails
/// and releases: the ending writes do not depend on it, and waits poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_without_the_waiters_migration_still_completes() {
    let store = common::store("unmigrated").await;
    // Connected before the migration is undone: connecting applies it.
    let other = elsewhere(&store).await;
    let (server, db) = common::server();
    server
        .psql(
            db,
            &format!(
                "ALTER TABLE {0}.idem_records DROP COLUMN waited CASCADE; \
                 DELETE FROM {0}.idem_migrations WHERE version = 6",
                store.schema()
            ),
        )
        .expect("undo migration 6");
    let running = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let waiting = Idempotency::builder(other)
        .wait_for_in_flight(Duration::from_secs(10))
        .build()
        .expect("executor");
    let id = RecordId::parse("orders", "old-schema").expect("valid");
    let (start, landed) = slow_run(&running, &id, Duration::from_millis(300));
    start.await.expect("handler started");
    let outcome = waiting
        .run(&id, None, |_| async {
            Ok::<_, std::io::Error>("twice".to_owned())
        })
        .await
        .expect("outcome");
    assert!(
        matches!(outcome, Outcome::Replayed { ref value } if value == "shipped"),
        "{outcome:?}"
    );
    landed.await.expect("the run completed");
}
