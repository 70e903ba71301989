//! What the conformance suite does not cover: leases run out on the system
//! clock, the 400 KB item limit, answers lost on the wire, a server that is
//! down, a missing table and a damaged item. Against moto_server.

mod common;

use std::time::Duration;

use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use bytes::Bytes;
use idem::step::Retry;
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{
    Context, FailureClass, GetRecord, Idempotency, ManualClock, Outcome, PurgeExpired, RecordId,
    RunError, State, Store, StoreError, Timestamp,
};
use idem_dynamodb::{client_for, DynamoStore, ItemTooLarge};
use idem_testkit::doubles::proxy::FaultProxy;
use idem_testkit::servers::moto::{ACCESS_KEY, REGION, SECRET_KEY};

const HOUR: Duration = Duration::from_secs(3600);

fn id(key: &str) -> RecordId {
    RecordId::parse("behaviour", key).expect("valid id")
}

async fn acquire(store: &DynamoStore, id: &RecordId, params: &ClaimParams) -> idem::store::Lease {
    match store.claim(id, params).await.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("expected to acquire {id}, got {other:?}"),
    }
}

async fn raw_item(
    store: &DynamoStore,
    id: &RecordId,
) -> std::collections::HashMap<String, AttributeValue> {
    common::item(store, id).await.expect("item present")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_run_out_on_the_system_clock() {
    let store = common::store("system-clock").await;
    let id = id("lease");
    // Margins of a second: on a loaded machine, a call to moto_server can
    // take a few hundred milliseconds.
    let short = ClaimParams::new(Duration::from_secs(1), HOUR);
    let first = acquire(&store, &id, &short).await;
    assert!(
        matches!(store.claim(&id, &short).await.expect("claim"), ClaimOutcome::InProgress { retry_after } if retry_after <= Duration::from_secs(1)),
        "a live lease is reported in progress"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = acquire(&store, &id, &short).await;
    assert!(second.takeover, "a lease that ran out is taken over");
    assert_eq!(second.attempt, 2);
    assert!(second.fence > first.fence);
    assert!(matches!(
        store
            .complete(&first, Bytes::from_static(b"late"), HOUR)
            .await,
        Err(StoreError::LeaseLost)
    ));
    store
        .complete(
            &second,
            Bytes::from_static(b"done"),
            Duration::from_millis(1500),
        )
        .await
        .expect("complete");
    assert_eq!(
        store.claim(&id, &short).await.expect("claim"),
        ClaimOutcome::Completed(Bytes::from_static(b"done"))
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // DynamoDB has not deleted the item (moto never does): it is expired
    // all the same, and a new record starts at attempt 1.
    assert!(store.get(&id).await.expect("get").is_none());
    let third = acquire(&store, &id, &short).await;
    assert_eq!((third.attempt, third.takeover), (1, false));
    assert!(third.fence > second.fence, "fences rise across expiry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_are_compressed_and_oversize_ones_refused_cleanly() {
    let clock = ManualClock::default();
    let store = common::store("sizes").await.with_clock(clock.clone());
    let params = ClaimParams::new(Duration::from_secs(30), HOUR);

    // 2 MB of JSON-like text: far over the item limit raw, far under it
    // compressed.
    let big: Vec<u8> = (0..2_000_000u32)
        .map(|i| b"{\"sku\":\"A-1\",\"qty\":1},"[i as usize % 22])
        .collect();
    let id_big = id("big");
    let lease = acquire(&store, &id_big, &params).await;
    store
        .complete(&lease, Bytes::from(big.clone()), HOUR)
        .await
        .expect("a compressible 2 MB response fits once compressed");
    let raw = raw_item(&store, &id_big).await;
    let packed = raw
        .get("rz")
        .expect("stored compressed")
        .as_b()
        .expect("binary");
    assert!(
        packed.as_ref().len() < 100_000,
        "compressed to {} bytes",
        packed.as_ref().len()
    );
    assert!(!raw.contains_key("rs"));
    assert_eq!(
        store.claim(&id_big, &params).await.expect("claim"),
        ClaimOutcome::Completed(Bytes::from(big)),
        "the replay is byte for byte"
    );

    // 500 KB of noise does not compress: refused before anything is sent,
    // with a typed error, and the record is untouched.
    let noise: Vec<u8> = (0..500_000).map(|_| rand::random::<u8>()).collect();
    let id_noise = id("noise");
    let lease = acquire(&store, &id_noise, &params).await;
    let err = store
        .complete(&lease, Bytes::from(noise), HOUR)
        .await
        .expect_err("over the item limit");
    let StoreError::Backend(source) = &err else {
        panic!("expected a backend error, got {err:?}")
    };
    let too_large = source
        .downcast_ref::<ItemTooLarge>()
        .expect("the source is ItemTooLarge");
    assert!(too_large.size > too_large.limit);
    assert!(err.to_string().contains("store backend error"));
    let record = store.get(&id_noise).await.expect("get").expect("present");
    assert!(
        matches!(record.state, State::InProgress { .. }),
        "nothing was written"
    );
    store
        .complete(&lease, Bytes::from_static(b"small"), HOUR)
        .await
        .expect("the holder can still complete");
}

/// The SDK retries a request whose answer was cut off; if the write had
/// landed, its condition now fails. That must not read as a lost lease, a
/// lost claim or a second acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_was_lost_is_not_reported_as_failed() {
    let upstream: std::net::SocketAddr = common::server()
        .url()
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    let (client, table) = common::table("lost-answers").await;
    let config = client
        .config()
        .to_builder()
        .endpoint_url(format!("http://{}", proxy.addr()))
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(10)
                .with_initial_backoff(Duration::from_millis(50)),
        )
        .build();
    let store = DynamoStore::new(Client::from_conf(config), table);
    let params = ClaimParams::new(Duration::from_secs(30), HOUR);

    // Cuts the next answer, then lets the retries through.
    let cut_once = |before: u64| {
        proxy.set_cut_after(Some(20));
        let proxy = &proxy;
        async move {
            while proxy.stats().resets == before {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            proxy.heal();
        }
    };

    let id = id("lost");
    let resets = proxy.stats().resets;
    let (claimed, ()) = tokio::join!(store.claim(&id, &params), cut_once(resets));
    let lease = match claimed.expect("claim") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("the claim that landed must be ours, got {other:?}"),
    };
    assert!(proxy.stats().resets > resets, "an answer was cut");

    let resets = proxy.stats().resets;
    let (completed, ()) = tokio::join!(
        store.complete(&lease, Bytes::from_static(b"paid"), HOUR),
        cut_once(resets)
    );
    completed.expect("a completion that landed is reported as done");
    assert!(proxy.stats().resets > resets, "an answer was cut");
    assert_eq!(
        store.claim(&id, &params).await.expect("claim"),
        ClaimOutcome::Completed(Bytes::from_static(b"paid"))
    );
    // A caller repeating the write is still refused.
    assert!(matches!(
        store
            .complete(&lease, Bytes::from_static(b"paid"), HOUR)
            .await,
        Err(StoreError::LeaseLost)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_unavailable_and_the_handler_does_not_run() {
    let port = idem_testkit::free_port().expect("port");
    let client = client_for(
        Some(&format!("http://127.0.0.1:{port}")),
        REGION,
        ACCESS_KEY,
        SECRET_KEY,
        None,
    )
    .expect("client");
    let config = client
        .config()
        .to_builder()
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        .build();
    let store = DynamoStore::new(Client::from_conf(config), "idem");
    let err = store
        .claim(&id("down"), &ClaimParams::new(Duration::from_secs(5), HOUR))
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");

    let idem = Idempotency::builder(store).build().expect("executor");
    let ran = std::sync::atomic::AtomicUsize::new(0);
    let result = idem
        .run(&id("down"), None, |_| async {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(1)
        })
        .await;
    assert!(result.is_err(), "fails closed: {result:?}");
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_a_backend_error_that_names_it() {
    let store = DynamoStore::new(common::client(), "idem-no-such-table");
    let err = store
        .claim(&id("k"), &ClaimParams::new(Duration::from_secs(5), HOUR))
        .await
        .expect_err("no table");
    let StoreError::Backend(source) = &err else {
        panic!("expected a backend error, got {err:?}")
    };
    assert!(
        source.to_string().contains("ResourceNotFoundException"),
        "{source}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_creates_a_missing_table_and_keeps_its_settings() {
    let table = format!("idem-built-{:08x}", rand::random::<u32>());
    let url = format!(
        "dynamodb://{table}?endpoint={}&create=true",
        common::server().url()
    );
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000_000_000));
    let store = DynamoStore::builder(&url)
        .expect("valid URL")
        .client(common::client())
        .clock(clock.clone())
        .grace(Duration::ZERO)
        .connect()
        .await
        .expect("the table is created");
    assert_eq!(store.table(), table);
    let lease = acquire(
        &store,
        &id("built"),
        &ClaimParams::new(Duration::from_secs(5), HOUR),
    )
    .await;
    assert_eq!(lease.lease_until, Timestamp::from_millis(1_000_000_005_000));
    store
        .complete(&lease, Bytes::from_static(b"done"), HOUR)
        .await
        .expect("complete");
    let item = raw_item(&store, &id("built")).await;
    // No grace: DynamoDB may sweep the item the second its retention ends.
    assert_eq!(
        item.get("sweep_at")
            .and_then(|v| v.as_n().ok())
            .map(String::as_str),
        Some("1000003600")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_item_is_reported_corrupt_and_left_alone() {
    let store = common::store("damaged").await;
    let id = id("damaged");
    let params = ClaimParams::new(Duration::from_secs(5), HOUR);
    let lease = acquire(&store, &id, &params).await;
    store
        .complete(&lease, Bytes::from_static(b"ok"), HOUR)
        .await
        .expect("complete");
    let mut item = raw_item(&store, &id).await;
    item.insert("st".into(), AttributeValue::S("?".into()));
    store
        .client()
        .put_item()
        .table_name(store.table())
        .set_item(Some(item.clone()))
        .send()
        .await
        .expect("damage the item");
    let err = store.claim(&id, &params).await.expect_err("corrupt");
    assert!(
        matches!(&err, StoreError::Corrupt { reason, .. } if reason.contains("unknown state")),
        "{err:?}"
    );
    assert_eq!(raw_item(&store, &id).await, item, "nothing was overwritten");
}

/// `n` random letters and digits: text that compresses little.
fn noise_text(n: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

/// The step journal lives in the record's item. A response that fits the
/// 400 KB limit alone, but not next to a 350 KB step result, passes the
/// store's own size check and is refused by DynamoDB. The run must end
/// failed with the reason and be replayed as such: left in progress, it
/// would be taken over after its lease and the handler (and its effects)
/// run again (issue 26, item 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_too_large_beside_its_step_journal_ends_failed_and_never_runs_again() {
    let store = common::store("journal-size").await;
    let idem = Idempotency::builder(store.clone())
        .lease(Duration::from_secs(1))
        .build()
        .expect("executor");
    let id = id("journal");
    let runs = std::sync::atomic::AtomicU32::new(0);
    let run = || {
        idem.run(&id, None, |ctx: Context| {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let quote: String = ctx
                    .step("quote", Retry, |_| async {
                        Ok::<_, std::io::Error>(noise_text(350_000))
                    })
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                Ok::<_, std::io::Error>(format!("{}{}", &quote[..10], noise_text(250_000)))
            }
        })
    };

    let first = run().await;
    let Err(RunError::Store(StoreError::Backend(refusal))) = &first else {
        panic!(
            "expected DynamoDB's refusal, got {:?}",
            first.map(|_| "a value")
        )
    };
    let why = idem::error_chain(refusal.as_ref());
    assert!(why.contains("maximum allowed size"), "{why}");
    let record = store.get(&id).await.expect("get").expect("present");
    let State::Failed { failure } = &record.state else {
        panic!("expected the record failed, got {:?}", record.state)
    };
    assert_eq!(failure.class, FailureClass::Terminal);
    assert!(
        failure.message.contains("store refused its response")
            && failure.message.contains("maximum allowed size"),
        "{}",
        failure.message
    );

    // Past the lease: a record left in progress would be taken over now.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let again = run().await;
    assert!(
        matches!(&again, Err(RunError::Failed(f)) if f == failure),
        "the failure is replayed: {:?}",
        again.map(|_| "a value")
    );
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the handler ran once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_executor_runs_each_key_once_under_concurrent_duplicates() {
    let store = common::store("executor").await;
    let idem = Idempotency::builder(store).build().expect("executor");
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        for key in 0..10 {
            let (idem, ran) = (idem.clone(), ran.clone());
            tasks.push(tokio::spawn(async move {
                let id = RecordId::parse("executor", &format!("order-{key}")).expect("id");
                loop {
                    let outcome = idem
                        .run(&id, None, |_| {
                            let ran = ran.clone();
                            async move {
                                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Ok::<_, std::io::Error>(key)
                            }
                        })
                        .await;
                    match outcome {
                        Ok(Outcome::Executed { value, .. })
                        | Ok(Outcome::Replayed { value, .. }) => {
                            assert_eq!(value, key);
                            return;
                        }
                        Ok(other) => panic!("unexpected {other:?}"),
                        Err(RunError::InProgress { .. }) => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("run failed: {e}"),
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        10,
        "160 runs over 10 keys execute exactly 10 times"
    );
}

/// Fences rise per key across a purge even when the clocks of the
/// processes disagree: an expired item is purged only once its fence is
/// older than the grace, so a claim from a clock up to the grace behind
/// still finds the fence, or takes one from a clock past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_do_not_fall_after_a_purge_by_a_clock_ahead() {
    let (client, table) = common::table("purge-fence").await;
    let ahead = ManualClock::new(Timestamp::from_millis(1_000_000_000));
    let behind = ManualClock::new(Timestamp::from_millis(1_000_000_000 - 10_000));
    let purger = DynamoStore::new(client.clone(), table.clone()).with_clock(ahead.clone());
    let claimer = DynamoStore::new(client, table).with_clock(behind.clone());
    let id = id("purged");
    let p = ClaimParams::new(Duration::from_secs(1), Duration::from_secs(1));
    let first = acquire(&purger, &id, &p).await;
    purger
        .complete(&first, Bytes::from_static(b"done"), Duration::from_secs(1))
        .await
        .expect("complete");
    ahead.advance(Duration::from_secs(5));
    behind.advance(Duration::from_secs(5));
    assert_eq!(
        purger.purge_expired(100).await.expect("purge"),
        0,
        "the fence is newer than the grace: the item stays"
    );
    assert_eq!(
        claimer.claim(&id, &p).await.expect("claim"),
        ClaimOutcome::Completed(Bytes::from_static(b"done")),
        "to a clock 10 s behind, the record is still live"
    );
    behind.advance(Duration::from_secs(10));
    let second = acquire(&claimer, &id, &p).await;
    assert!(
        second.fence > first.fence,
        "a clock behind claims after the purge: fence {} after {}",
        second.fence,
        first.fence
    );
    claimer
        .complete(
            &second,
            Bytes::from_static(b"again"),
            Duration::from_secs(1),
        )
        .await
        .expect("complete");
    ahead.advance(idem_dynamodb::DEFAULT_GRACE + Duration::from_secs(10));
    assert_eq!(
        purger.purge_expired(100).await.expect("purge"),
        1,
        "past the grace, the item goes"
    );
}
