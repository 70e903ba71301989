//! Faults against real servers: a Redis stopped mid-run and started again,
//! and a Cluster resharded under load (records and their step journals). Each test owns its servers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::step::Retry;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{Idempotency, Outcome, RecordId, RunError, Store, StoreError};
use idem_redis::RedisStore;
use idem_testkit::doubles::proxy::FaultProxy;
use idem_testkit::servers::redis::{RedisCluster, RedisServer};

const BOUND: Duration = Duration::from_secs(10);

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

/// For claims that must still be held when checked at the end of a long
/// test (a reshard can take over a minute on a loaded machine): a lease
/// that cannot run out first, so a later claim finds them in progress
/// rather than taking them over.
fn held_params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(3600), Duration::from_secs(3600))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_fails_closed_and_the_store_recovers() {
    let mut server = RedisServer::start().expect("start redis-server");
    let store = RedisStore::builder(&server.url())
        .expect("valid URL")
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect");
    let idem = Idempotency::builder(store.clone())
        .build()
        .expect("executor");
    let ran = Arc::new(AtomicUsize::new(0));
    let run = |key: String| {
        let (idem, ran) = (idem.clone(), Arc::clone(&ran));
        async move {
            let id = RecordId::parse("faults", &key).expect("valid id");
            idem.run(&id, None, |_| async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(key)
            })
            .await
        }
    };
    assert!(matches!(
        run("before".into()).await,
        Ok(Outcome::Executed { .. })
    ));

    server.stop();
    for i in 0..5 {
        let id = RecordId::parse("faults", &format!("down{i}")).expect("valid id");
        let claim = tokio::time::timeout(BOUND, store.claim(&id, &params()))
            .await
            .expect("a claim against a dead server returns instead of hanging");
        assert!(
            matches!(claim, Err(StoreError::Unavailable(_))),
            "claim {i} with the server down: {claim:?}"
        );
        let outcome = tokio::time::timeout(BOUND, run(format!("down{i}")))
            .await
            .expect("run returns");
        assert!(
            matches!(outcome, Err(RunError::Store(StoreError::Unavailable(_)))),
            "run {i} with the server down: {outcome:?}"
        );
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "no handler runs while the store is down (fail-closed)"
    );

    server.start_again().expect("restart redis-server");
    // The connection comes back by itself; the restarted server has no
    // script cache, so this also covers the EVALSHA → EVAL fallback.
    let mut recovered = None;
    for _ in 0..100 {
        match run("after".into()).await {
            Ok(outcome) => {
                recovered = Some(outcome);
                break;
            }
            Err(RunError::Store(StoreError::Unavailable(_))) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(other) => panic!("unexpected error after restart: {other:?}"),
        }
    }
    assert!(
        matches!(recovered, Some(Outcome::Executed { .. })),
        "the store recovers once the server is back: {recovered:?}"
    );
    assert!(matches!(
        run("after".into()).await,
        Ok(Outcome::Replayed { .. })
    ));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// Found by the fault-injection runs (`idem-chaos`, seed 1): a reply cut
/// off in the middle, while the connection was being made again, left the
/// `redis` crate's connection manager holding the failed connection
/// attempt for good, and every later command failed with the same parse
/// error. The store must come back once the network does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_cut_off_midway_does_not_break_the_store_for_good() {
    let server = RedisServer::start().expect("start redis-server");
    let addr = format!("127.0.0.1:{}", server.port())
        .parse()
        .expect("address");
    let proxy = FaultProxy::start(addr).await.expect("proxy");
    let store = RedisStore::builder(&format!("redis://{}", proxy.addr()))
        .expect("valid URL")
        .response_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect");
    let id = |n: usize| RecordId::parse("cut", &format!("k{n}")).expect("valid id");
    assert!(store.claim(&id(0), &params()).await.is_ok());
    for round in 1..=5 {
        // Replies (including those of the handshake of a new connection)
        // are cut after a few bytes and their connection reset.
        proxy.set_cut_after(Some(3 + round));
        proxy.reset_all();
        for n in 0..4 {
            let _ = store.claim(&id(round * 10 + n), &params()).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proxy.heal();
        let mut last = None;
        let deadline = tokio::time::Instant::now() + BOUND;
        while tokio::time::Instant::now() < deadline {
            match store.claim(&id(round * 10 + 9), &params()).await {
                Ok(outcome) => {
                    last = None;
                    assert!(matches!(outcome, ClaimOutcome::Acquired(_)), "{outcome:?}");
                    break;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            last.is_none(),
            "round {round}: the store never recovered once the network healed: {last:?}"
        );
    }
}

#[tokio::test]
async fn connecting_to_nothing_is_a_typed_error() {
    let port = RedisServer::start().expect("start").port();
    // The server above is gone (dropped); nothing listens on its port.
    let err = tokio::time::timeout(
        BOUND,
        RedisStore::connect(&format!("redis://u:hunter2@127.0.0.1:{port}")),
    )
    .await
    .expect("connect returns")
    .expect_err("nothing listens");
    assert!(
        matches!(err, idem_redis::ConnectError::Unavailable { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&port.to_string()) && !text.contains("hunter2"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_resharded_under_load_still_runs_each_key_once() {
    const KEYS: usize = 3000;
    const WORKERS: usize = 8;
    let cluster = Arc::new(RedisCluster::start().expect("start a Redis Cluster"));
    let store = RedisStore::connect(&cluster.url()).await.expect("connect");
    let idem = Idempotency::builder(store).build().expect("executor");
    let runs: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
    let charges: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
    let resharding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let batch_store = RedisStore::connect(&cluster.url()).await.expect("connect");
    batch_store.load_scripts().await.expect("load scripts");

    // Move a third of node 0's slots to node 1 and then on to node 2 while
    // the workers run: keys in moving slots meet ASK, then MOVED.
    let reshard = {
        let (cluster, resharding) = (Arc::clone(&cluster), Arc::clone(&resharding));
        tokio::task::spawn_blocking(move || {
            let result = cluster
                .reshard(0, 1, 1800)
                .and_then(|()| cluster.reshard(1, 2, 1800));
            resharding.store(false, Ordering::SeqCst);
            result
        })
    };

    let timed_out = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (idem, runs, charges, resharding, timed_out) = (
                idem.clone(),
                Arc::clone(&runs),
                Arc::clone(&charges),
                Arc::clone(&resharding),
                Arc::clone(&timed_out),
            );
            tokio::spawn(async move {
                let mut passes = 0;
                let mut replayed = 0usize;
                // Keep going while slots move, and at least two passes.
                while passes < 2 || resharding.load(Ordering::SeqCst) {
                    for i in 0..KEYS {
                        let k = (i * 7 + w * 389) % KEYS;
                        let id = RecordId::parse("reshard", &format!("k{k}")).expect("valid");
                        loop {
                            let (runs, charges) = (Arc::clone(&runs), Arc::clone(&charges));
                            let result = idem
                                .run(&id, None, |ctx| async move {
                                    *runs.lock().expect("lock").entry(k).or_default() += 1;
                                    // A journaled step: its journal moves
                                    // with the record, under the same scripts.
                                    ctx.step("charge", Retry, |_| async move {
                                        *charges.lock().expect("lock").entry(k).or_default() += 1;
                                        Ok::<_, std::io::Error>(k)
                                    })
                                    .await
                                    .map_err(|e| std::io::Error::other(idem::error_chain(&e)))
                                })
                                .await;
                            match result {
                                Ok(Outcome::Replayed { .. }) => {
                                    replayed += 1;
                                    break;
                                }
                                Ok(_) => break,
                                Err(RunError::InProgress { .. }) => {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                                // A claim may time out while the Cluster
                                // moves its slot: the handler did not run
                                // (a completion would be retried for the
                                // whole lease first). Try again, as a
                                // caller would; if the claim landed, the
                                // retry waits out its lease and takes over.
                                Err(RunError::Store(StoreError::Unavailable(_))) => {
                                    timed_out.fetch_add(1, Ordering::SeqCst);
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                                Err(other) => panic!("key {k} during resharding: {other:?}"),
                            }
                        }
                    }
                    passes += 1;
                }
                replayed
            })
        })
        .collect();

    // Meanwhile, batches: 100 claims per call, each key twice in one
    // batch, through ASK and MOVED answers. A key is never acquired twice,
    // and the repeat is answered after the first (in progress, not
    // acquired). A claim may time out while the Cluster moves its slot
    // (StoreError::Unavailable: its effect is unknown, as with any
    // timeout); those are counted, and every key is checked afterwards.
    let batches = {
        let (store, resharding) = (batch_store, Arc::clone(&resharding));
        tokio::spawn(async move {
            let (mut acquired, mut unavailable) = (0usize, 0usize);
            let mut batch = 0usize;
            while batch < 20 || resharding.load(Ordering::SeqCst) {
                let ids: Vec<RecordId> = (0..50)
                    .map(|j| RecordId::parse("batches", &format!("b{batch}-{j}")).expect("valid"))
                    .collect();
                let claims: Vec<_> = ids
                    .iter()
                    .chain(ids.iter())
                    .map(|id| (id.clone(), held_params()))
                    .collect();
                let results = idem::ClaimMany::claim_many(&store, &claims)
                    .await
                    .expect("batch sent");
                let mut first_won = [false; 50];
                for (j, result) in results.into_iter().enumerate() {
                    match (j < 50, result) {
                        (_, Err(StoreError::Unavailable(_))) => unavailable += 1,
                        (true, Ok(ClaimOutcome::Acquired(_))) => {
                            first_won[j] = true;
                            acquired += 1;
                        }
                        (false, Ok(ClaimOutcome::InProgress { .. })) => {}
                        (false, Ok(ClaimOutcome::Acquired(_))) if !first_won[j - 50] => {
                            acquired += 1
                        }
                        (first, other) => panic!(
                            "batch {batch} claim {j} ({}): {other:?}",
                            if first { "first" } else { "repeat" }
                        ),
                    }
                }
                batch += 1;
            }
            (acquired, unavailable, batch, store)
        })
    };

    let mut replayed = 0;
    for worker in workers {
        replayed += worker.await.expect("worker");
    }
    let (acquired, unavailable, batches, batch_store) = batches.await.expect("batches");
    eprintln!(
        "batches: {batches} × 100 claims, {acquired} acquired, {unavailable} timed out during the move; \
         runs: {} claims timed out and were tried again",
        timed_out.load(Ordering::SeqCst)
    );
    assert!(
        unavailable * 10 < batches * 100,
        "more than a tenth of the batched claims failed: {unavailable} of {}",
        batches * 100
    );
    // Every batch key is now in progress exactly once: acquired by one
    // claim (or by one whose answer timed out), never by two.
    let mut in_progress = 0;
    for batch in 0..batches {
        for j in 0..50 {
            let id = RecordId::parse("batches", &format!("b{batch}-{j}")).expect("valid");
            // A connection left broken by the move times out once, is
            // replaced in the background, and the claim goes through.
            let mut tries = 0;
            let outcome = loop {
                match batch_store.claim(&id, &held_params()).await {
                    Err(StoreError::Unavailable(_)) if tries < 10 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    other => break other.expect("the store recovers after the move"),
                }
            };
            match outcome {
                ClaimOutcome::InProgress { .. } => in_progress += 1,
                ClaimOutcome::Acquired(_) => {}
                other => panic!("{id}: {other:?}"),
            }
        }
    }
    assert!(
        in_progress >= acquired,
        "{acquired} batch claims acquired but only {in_progress} keys are held"
    );
    reshard.await.expect("reshard task").expect("reshard");
    cluster
        .wait_until_ok()
        .expect("cluster healthy after resharding");

    let runs = runs.lock().expect("lock").clone();
    let doubled: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(doubled.is_empty(), "keys not run exactly once: {doubled:?}");
    let charges = charges.lock().expect("lock").clone();
    let doubled: Vec<_> = charges.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        doubled.is_empty(),
        "steps not run exactly once: {doubled:?}"
    );
    assert_eq!(charges.len(), KEYS, "every key's step ran");
    assert_eq!(runs.len(), KEYS, "every key ran");
    assert!(replayed >= KEYS * (2 * WORKERS - 1), "replays: {replayed}");

    // The keys really were spread over the moved slots: every node now
    // holds some, and every one is still claimable as completed.
    let store = RedisStore::connect(&cluster.url()).await.expect("connect");
    for node in cluster.nodes() {
        let size: usize = node
            .cli("DBSIZE")
            .expect("dbsize")
            .trim()
            .parse()
            .expect("a number");
        assert!(size > 0, "node {} holds no record", node.port());
    }
    for k in (0..KEYS).step_by(97) {
        let id = RecordId::parse("reshard", &format!("k{k}")).expect("valid");
        assert!(matches!(
            store.claim(&id, &params()).await,
            Ok(ClaimOutcome::Completed(_))
        ));
    }
}

/// A wait that ends while another wait holds the pub/sub connection (to
/// subscribe, slowly: every reply is 60 ms late here) still unsubscribes:
/// subscriptions do not pile up on the server for the life of the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_end_while_another_subscribes_still_unsubscribe() {
    let server = RedisServer::start().expect("start redis-server");
    let addr = format!("127.0.0.1:{}", server.port())
        .parse()
        .expect("address");
    let proxy = FaultProxy::start(addr).await.expect("proxy");
    let store = RedisStore::builder(&format!("redis://{}", proxy.addr()))
        .expect("valid URL")
        .connect()
        .await
        .expect("connect");
    let ids: Vec<RecordId> = (0..6)
        .map(|n| RecordId::parse("waits", &format!("w{n}")).expect("valid id"))
        .collect();
    for id in &ids {
        assert!(matches!(
            store.claim(id, &held_params()).await,
            Ok(ClaimOutcome::Acquired(_))
        ));
    }
    proxy.set_delay(Duration::from_millis(60));
    // Staggered so that each wait ends while a later one is subscribing.
    let waits: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(90 * n as u64)).await;
                store.wait_for_change(&id, Duration::from_millis(100)).await;
            })
        })
        .collect();
    for wait in waits {
        wait.await.expect("wait");
    }
    proxy.set_delay(Duration::ZERO);
    let mut left = String::new();
    for _ in 0..50 {
        left = server.cli("PUBSUB CHANNELS *").expect("pubsub");
        if left.trim().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left.trim().is_empty(), "still subscribed: {left}");
}

/// A slot caught mid-move with a record on one node and its step journal
/// already on the other (a reshard moves keys one `MIGRATE` at a time):
/// the step script declares both keys, so the Cluster answers TRYAGAIN
/// (unavailable: try again) instead of running it on the record's node
/// without its journal, where a finished step read as not begun, or the
/// script failed as refused. Once the slot has moved, the step is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_and_its_journal_split_by_a_move_are_never_read_apart() {
    use idem::store::StepBegin;
    use idem::StepJournal;
    let cluster = RedisCluster::start().expect("start a Redis Cluster");
    let store = RedisStore::builder(&cluster.url())
        .expect("valid URL")
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect");
    let id = RecordId::parse("split", "order-1").expect("valid id");
    let ClaimOutcome::Acquired(lease) = store.claim(&id, &held_params()).await.expect("claim")
    else {
        panic!("a fresh key is acquired");
    };
    store.begin_step(&lease, "charge").await.expect("begin");
    store
        .finish_step(&lease, "charge", bytes::Bytes::from_static(b"ch_1"))
        .await
        .expect("finish");

    let key = store.record_key(&id);
    let journal = format!("{key}:j");
    let slot = cluster
        .cli(0, &format!("CLUSTER KEYSLOT {key}"))
        .expect("keyslot")
        .trim()
        .to_owned();
    let ids = cluster.node_ids().expect("ids");
    let count = |node: usize| -> usize {
        cluster
            .cli(node, &format!("CLUSTER COUNTKEYSINSLOT {slot}"))
            .expect("count")
            .trim()
            .parse()
            .expect("a number")
    };
    let from = (0..3).find(|&n| count(n) > 0).expect("the slot's owner");
    let to = (from + 1) % 3;
    let to_port = cluster.nodes()[to].port();
    cluster
        .cli(
            to,
            &format!("CLUSTER SETSLOT {slot} IMPORTING {}", ids[from]),
        )
        .expect("importing");
    cluster
        .cli(
            from,
            &format!("CLUSTER SETSLOT {slot} MIGRATING {}", ids[to]),
        )
        .expect("migrating");
    cluster
        .cli(
            from,
            &format!("MIGRATE 127.0.0.1 {to_port} {journal} 0 5000"),
        )
        .expect("the journal moves first");

    let split = store.begin_step(&lease, "charge").await;
    assert!(
        matches!(
            split,
            Err(StoreError::Unavailable(_)) | Ok(StepBegin::Done(_))
        ),
        "the record without its journal: {split:?}"
    );

    cluster
        .cli(from, &format!("MIGRATE 127.0.0.1 {to_port} {key} 0 5000"))
        .expect("the record follows");
    for node in 0..3 {
        cluster
            .cli(node, &format!("CLUSTER SETSLOT {slot} NODE {}", ids[to]))
            .expect("moved");
    }
    let mut tries = 0;
    let moved = loop {
        match store.begin_step(&lease, "charge").await {
            Err(StoreError::Unavailable(_)) if tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other,
        }
    };
    assert_eq!(
        moved.expect("found after the move"),
        StepBegin::Done(bytes::Bytes::from_static(b"ch_1"))
    );
}
