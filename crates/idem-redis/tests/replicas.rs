//! Writes that wait for replicas (`replica_acks`): a completion no
//! replica acknowledged is not reported done (its key is answered from
//! the record once the replica has it), on one server with a replica and
//! on a Cluster; and completions reported done survive their master's
//! death and its replacement.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{Idempotency, Outcome, RecordId, RunError, StoreError};
use idem_redis::RedisStore;
use idem_testkit::servers::redis::{ClusterSpec, RedisCluster, RedisServer};

/// Lets the test make a replica stop answering (`DEBUG SLEEP`).
const DEBUG: [&str; 2] = ["--enable-debug-command", "local"];

/// Runs a key whose handler puts every replica to sleep for 5 s before
/// it returns, so its completion reaches the master and no replica within
/// the executor's retries (a 1 s lease, then a read-back, each waiting up
/// to 800 ms for the replica): the run must not say done, the handler
/// must not run again, and once the replicas wake the key replays the
/// stored value. (The waits are long because the Clusters of the other
/// cases start and sync on the same two cores.)
async fn unacknowledged_completion_is_not_reported(url: &str, replica_ports: Vec<u16>) {
    let store = RedisStore::builder(url)
        .expect("valid URL")
        .replica_acks(1, Duration::from_millis(800))
        .connect()
        .await
        .expect("connect");
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(1))
        .build()
        .expect("executor");
    let ran = Arc::new(AtomicUsize::new(0));
    let run = |id: RecordId, sleep: Vec<u16>| {
        let (idem, ran) = (idem.clone(), Arc::clone(&ran));
        async move {
            idem.run(&id, None, move |_| async move {
                ran.fetch_add(1, Ordering::SeqCst);
                for port in sleep {
                    std::thread::spawn(move || {
                        let _ = std::process::Command::new("redis-cli")
                            .args(["-p", &port.to_string(), "DEBUG", "SLEEP", "5"])
                            .output();
                    });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, std::io::Error>("shipped".to_owned())
            })
            .await
        }
    };
    // A master streams to a replica that has just synced only after the
    // replica's first acknowledgement (sent once a second), and a loaded
    // machine can miss one 800 ms wait: the warm-up tries fresh keys until
    // one is acknowledged, and only a refusal as unavailable may come
    // before it.
    let mut warm = 0;
    loop {
        let key = RecordId::parse("orders", &format!("acked-{warm}")).expect("valid");
        warm += 1;
        match run(key, Vec::new()).await {
            Ok(outcome) => {
                assert!(matches!(outcome, Outcome::Executed { .. }));
                break;
            }
            Err(RunError::Store(StoreError::Unavailable(why))) if warm < 5 => {
                assert!(why.to_string().contains("replicas acknowledged"), "{why}")
            }
            Err(other) => panic!("no replica acknowledged {warm} warm-up writes: {other:?}"),
        }
    }
    let warmed = ran.load(Ordering::SeqCst);

    let id = RecordId::parse("orders", "unacked").expect("valid");
    let started = std::time::Instant::now();
    match run(id.clone(), replica_ports).await {
        Err(RunError::Store(StoreError::Unavailable(why))) => {
            assert!(why.to_string().contains("replicas acknowledged"), "{why}")
        }
        other => panic!("a completion no replica has was reported as {other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), warmed + 1);
    tokio::time::sleep(Duration::from_millis(5500).saturating_sub(started.elapsed())).await;
    let outcome = run(id, Vec::new()).await.expect("replayed");
    assert!(matches!(&outcome, Outcome::Replayed { .. }), "{outcome:?}");
    assert_eq!(outcome.value(), "shipped");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        warmed + 1,
        "the handler ran once per key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_completion_is_not_reported_on_one_server() {
    let mut args = vec!["--repl-diskless-sync-delay", "0"];
    args.extend(DEBUG);
    let master = RedisServer::start_with(idem_testkit::free_port().expect("port"), &args)
        .expect("redis-server");
    let replica = RedisServer::replica_of(&master, &DEBUG).expect("replica");
    unacknowledged_completion_is_not_reported(&master.url(), vec![replica.port()]).await;
}

fn cluster_with_replicas() -> RedisCluster {
    RedisCluster::start_with(ClusterSpec {
        replicas: 1,
        extra: DEBUG.iter().map(|s| (*s).to_owned()).collect(),
        ..ClusterSpec::default()
    })
    .expect("a Redis Cluster with replicas")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_completion_is_not_reported_on_a_cluster() {
    let cluster = cluster_with_replicas();
    let masters = cluster.masters().expect("masters");
    let replicas: Vec<u16> = masters
        .iter()
        .map(|m| {
            let r = cluster.replica_of(*m).expect("role").expect("a replica");
            cluster.nodes()[r].port()
        })
        .collect();
    unacknowledged_completion_is_not_reported(&cluster.url(), replicas).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_survive_a_failover_and_the_dead_masters_replacement() {
    let mut cluster = cluster_with_replicas();
    let store = RedisStore::builder(&cluster.url())
        .expect("valid URL")
        .replica_acks(1, Duration::from_secs(1))
        .connect()
        .await
        .expect("connect");
    let idem = Idempotency::builder(store)
        .lease(Duration::from_secs(2))
        .build()
        .expect("executor");
    let ran = Arc::new(AtomicUsize::new(0));
    let run_all = |expect_executed: bool| {
        let (idem, ran) = (idem.clone(), Arc::clone(&ran));
        async move {
            for k in 0..200 {
                let id = RecordId::parse("orders", &format!("o{k}")).expect("valid");
                // The first call on a dead master's connection fails (as
                // unavailable) and sends the next by the new slot map; a
                // claim whose replica was slow to answer is retried after
                // its lease, as a caller would.
                let mut tries = 0;
                let outcome = loop {
                    let ran = Arc::clone(&ran);
                    let result = idem
                        .run(&id, None, |_| async move {
                            ran.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, std::io::Error>(k)
                        })
                        .await;
                    match result {
                        Err(RunError::Store(StoreError::Unavailable(_))) if tries < 10 => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(RunError::InProgress { retry_after }) if tries < 10 => {
                            tries += 1;
                            tokio::time::sleep(retry_after).await;
                        }
                        other => break other.unwrap_or_else(|e| panic!("key {k}: {e:?}")),
                    }
                };
                assert_eq!(*outcome.value(), k);
                assert_eq!(matches!(outcome, Outcome::Executed { .. }), expect_executed);
            }
        }
    };
    run_all(true).await;
    // A master without its replica answers nothing under replica
    // acknowledgements, so the failover is followed by the dead node's
    // replacement before the keys run again.
    let master = cluster.masters().expect("masters")[0];
    let promoted = tokio::task::block_in_place(|| cluster.fail_over(master)).expect("failover");
    tokio::task::block_in_place(|| cluster.replace(master, promoted)).expect("replace");
    run_all(false).await;
    assert_eq!(ran.load(Ordering::SeqCst), 200, "each key ran once");
}

/// The executor reads back a completion whose answer was lost, and after
/// a dropped connection it does so on a new one: the read-back must not
/// confirm a completion no replica holds. Redis 7.0 moves a client's
/// `WAIT` offset to the master's replication offset after every command,
/// but 7.2 and later only after a command that propagated, so the read
/// writes the record again as it is (`get.lua`, 'sync') and the `WAIT`
/// behind it covers every write made before it, on any connection, on
/// either. Here the completion reaches the master while its replica
/// sleeps, and another connection reads it back: not confirmed
/// (unavailable) until the replica has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_back_on_another_connection_waits_for_the_replicas_too() {
    use idem::store::{ClaimOutcome, ClaimParams};
    use idem::Store;

    let mut args = vec!["--repl-diskless-sync-delay", "0"];
    args.extend(DEBUG);
    let master = RedisServer::start_with(idem_testkit::free_port().expect("port"), &args)
        .expect("redis-server");
    let replica = RedisServer::replica_of(&master, &DEBUG).expect("replica");
    let connect = || async {
        RedisStore::builder(&master.url())
            .expect("valid URL")
            .replica_acks(1, Duration::from_millis(800))
            .connect()
            .await
            .expect("connect")
    };
    let (writer, reader) = (connect().await, connect().await);
    let params = ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600));
    // The first acknowledgement may take a second after the replica's sync.
    // (The replica then sleeps 6 s: each connection's first call of a
    // script meets NOSCRIPT and waits out a replica timeout before its
    // EVAL does.)
    let mut tries = 0;
    let (id, lease) = loop {
        let id = RecordId::parse("orders", &format!("read-back-{tries}")).expect("valid");
        tries += 1;
        match writer.claim(&id, &params).await {
            Ok(ClaimOutcome::Acquired(lease)) => break (id, lease),
            Err(StoreError::Unavailable(_)) if tries < 5 => {}
            other => panic!("no replica acknowledged {tries} claims: {other:?}"),
        }
    };
    let port = replica.port();
    let sleeper = std::thread::spawn(move || {
        std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "DEBUG", "SLEEP", "6"])
            .output()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let done = writer
        .complete(&lease, "shipped".into(), Duration::from_secs(3600))
        .await;
    assert!(
        matches!(&done, Err(StoreError::Unavailable(_))),
        "no replica acknowledged it: {done:?}"
    );
    let seen = reader.peek(&id).await;
    assert!(
        matches!(&seen, Err(StoreError::Unavailable(_))),
        "a completion no replica holds was confirmed on another connection: {seen:?}"
    );
    sleeper.join().expect("sleeper").expect("redis-cli");
    let seen = loop {
        match reader.peek(&id).await {
            Ok(seen) => break seen,
            Err(StoreError::Unavailable(_)) if tries < 20 => tries += 1,
            other => panic!("the replica never caught up: {other:?}"),
        }
    };
    let record = seen.expect("the record");
    assert!(record.state.completed_with(b"shipped"), "{record:?}");
}
