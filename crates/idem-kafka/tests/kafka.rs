//! The Kafka adapter against a real Kafka-protocol broker (Tansu, started
//! for this test run on a free loopback port) with the Redis store.
//!
//! The main case runs workers as separate processes of this test binary
//! and kills one with SIGKILL (by PID) in the middle of a handler; an
//! effects ledger on disk, written by the handlers, shows one effect per
//! message, none lost, and dead-letters only for the bad ones. Others
//! rebalance the group mid-stream and check per-partition order, retry in
//! place, stop cleanly, and refuse unsafe configurations at start-up.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{create_topic, Setup};
use idem_consumer::{Stopped, WindowError};
use idem_kafka::{KafkaConsumer, KafkaConsumerError, PartitionOrder};
use idem_redis::RedisStore;
use idem_testkit::consumers::ledger::{eventually, order_handler, Ledger};
use tokio::sync::oneshot;

idem_testkit::killed_worker_test!(Setup, "kill");

/// Runs `kafka` with the order handler in a task, until the returned
/// sender fires.
fn run_orders(
    kafka: KafkaConsumer<RedisStore, idem::Json>,
    ledger: &Ledger,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<Stopped, KafkaConsumerError>>,
) {
    let ledger = ledger.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(kafka.run(
        move |job| order_handler(job, ledger.clone(), None),
        async {
            stopped.await.ok();
        },
    ));
    (stop, running)
}

/// One group member's run, as a task that can be stopped.
struct Member {
    stop: oneshot::Sender<()>,
    running: tokio::task::JoinHandle<idem_consumer::ConsumerStats>,
    consumer: idem_consumer::Consumer<RedisStore>,
}

/// Effects in the order they ran, as (partition, sequence number).
type Order = Arc<Mutex<Vec<(i32, u32)>>>;

async fn member(setup: &Setup, order: Order) -> Member {
    let kafka = setup.kafka().await;
    let consumer = kafka.consumer().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        let stats = kafka.consumer().clone();
        kafka
            .run(
                move |job| {
                    let order = Arc::clone(&order);
                    async move {
                        let body: serde_json::Value = job.json()?;
                        tokio::time::sleep(Duration::from_millis(25)).await;
                        let seq = body["seq"].as_u64().expect("seq") as u32;
                        order
                            .lock()
                            .expect("order")
                            .push((job.message().partition(), seq));
                        Ok::<_, idem::Terminal>(())
                    }
                },
                async {
                    stopped.await.ok();
                },
            )
            .await
            .expect("run");
        stats.stats()
    });
    Member {
        stop,
        running,
        consumer,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_mid_stream_keeps_partition_order_and_one_effect_per_record() {
    let setup = Setup::new("rebalance", 4).await;
    let producer = setup.producer();
    let total: u32 = 400;
    for seq in 0..total {
        let key = format!("r-{seq}");
        let body = format!(r#"{{"seq":{seq}}}"#);
        let partition = (seq % 4) as i32;
        producer
            .send(&setup.topic, Some(&key), &body, Some(partition))
            .await;
    }
    let order: Order = Arc::default();
    let count = |order: &Order| order.lock().expect("order").len();

    let first = member(&setup, Arc::clone(&order)).await;
    assert!(
        eventually(Duration::from_secs(60), || count(&order) >= 40).await,
        "the first member got going"
    );
    let second = member(&setup, Arc::clone(&order)).await;
    // Leave only once the join has settled: Tansu 0.6 never completes a
    // rebalance whose leader leaves in the middle of it.
    assert!(
        eventually(Duration::from_secs(60), || second.consumer.stats().executed
            >= 10)
        .await,
        "the second member was given partitions"
    );
    first.stop.send(()).expect("stop the first member");
    let first_stats = first.running.await.expect("first member");
    assert!(
        eventually(Duration::from_secs(90), || {
            let seen: std::collections::HashSet<u32> =
                order.lock().expect("order").iter().map(|e| e.1).collect();
            seen.len() == total as usize
        })
        .await,
        "every record ran: {} of {total}; committed {:?}",
        count(&order),
        setup.progress(4)
    );
    let committed = setup.caught_up(4).await;
    second.stop.send(()).expect("stop the second member");
    let second_stats = second.running.await.expect("second member");

    let order = order.lock().expect("order").clone();
    let mut per_key: HashMap<u32, usize> = HashMap::new();
    for (_, seq) in &order {
        *per_key.entry(*seq).or_default() += 1;
    }
    let twice: Vec<_> = per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "records that ran twice: {twice:?}");
    assert_eq!(per_key.len(), total as usize);
    let mut per_partition: BTreeMap<i32, Vec<u32>> = BTreeMap::new();
    for (partition, seq) in &order {
        per_partition.entry(*partition).or_default().push(*seq);
    }
    for (partition, seqs) in &per_partition {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "partition {partition} ran out of order: {seqs:?}"
        );
    }
    assert_eq!(
        first_stats.executed + second_stats.executed,
        u64::from(total),
        "{first_stats:?} {second_stats:?}"
    );
    assert!(
        first_stats.executed > 0 && second_stats.executed > 0,
        "both members did work: {first_stats:?} {second_stats:?}"
    );
    assert!(committed, "{:?}", setup.progress(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_record_is_retried_in_place_and_nothing_passes_it() {
    let setup = Setup::new("retry", 1).await;
    let producer = setup.producer();
    let topic = setup.topic.clone();
    producer
        .send(
            &topic,
            Some("flaky-1"),
            r#"{"id":"flaky-1","flaky":true}"#,
            None,
        )
        .await;
    for key in ["after-1", "after-2"] {
        producer
            .send(&topic, Some(key), &format!(r#"{{"id":"{key}"}}"#), None)
            .await;
    }
    let kafka = setup.kafka().await;
    let stats = kafka.consumer().clone();
    let (stop, running) = run_orders(kafka, &setup.ledger);
    let done = eventually(Duration::from_secs(30), || {
        setup.ledger.effects().len() == 3
    })
    .await;
    stop.send(()).expect("stop");
    running.await.expect("task").expect("run");
    assert!(done, "{:?}", setup.ledger.effects());
    assert_eq!(
        setup.ledger.effects_in_order(),
        ["flaky-1", "after-1", "after-2"],
        "the later records waited for the retried one"
    );
    assert_eq!(
        setup.ledger.started()["flaky-1"],
        2,
        "failed once, then ran"
    );
    let stats = stats.stats();
    assert_eq!((stats.executed, stats.retries), (3, 1), "{stats:?}");
    assert_eq!(setup.progress(1)[&0], (3, 3), "committed past all three");
}

/// With claims made ahead, a partition's waiting records are claimed in
/// batches, and each still runs once, in offset order, with retries in
/// place and duplicates replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_made_ahead_keep_offset_order_and_one_effect_per_key() {
    let setup = Setup::new("ahead", 1).await;
    let producer = setup.producer();
    let mut first_seen = Vec::new();
    for round in 0..2 {
        for i in 0..40 {
            let key = format!("k-{i}");
            let flaky = i == 20;
            let body = format!(r#"{{"id":"{key}","flaky":{flaky}}}"#);
            producer.send(&setup.topic, Some(&key), &body, None).await;
            if round == 0 {
                first_seen.push(key);
            }
        }
    }
    let kafka = KafkaConsumer::builder(
        &setup.bootstrap,
        &setup.group(),
        &[&setup.topic],
        setup.consumer().await,
    )
    .consumer_set("session.timeout.ms", "6000")
    .claim_ahead(16)
    .connect()
    .await
    .expect("connect");
    let stats = kafka.consumer().clone();
    let (stop, running) = run_orders(kafka, &setup.ledger);
    let done = eventually(Duration::from_secs(30), || {
        let s = stats.stats();
        s.executed + s.replayed == 80
    })
    .await;
    let committed = setup.caught_up(1).await;
    stop.send(()).expect("stop");
    running.await.expect("task").expect("run");
    assert!(done, "{:?}", stats.stats());
    assert_eq!(
        setup.ledger.effects_in_order(),
        first_seen,
        "one effect per key, in offset order"
    );
    assert_eq!(setup.ledger.started()["k-20"], 2, "failed once, then ran");
    let stats = stats.stats();
    assert_eq!(
        (stats.executed, stats.replayed, stats.retries),
        (40, 40, 1),
        "{stats:?}"
    );
    assert!(committed, "committed past all 80: {:?}", setup.progress(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_key_order_other_keys_pass_a_retrying_record_and_each_key_keeps_its_order() {
    let setup = Setup::new("keys", 1).await;
    let producer = setup.producer();
    let topic = setup.topic.clone();
    for (key, record_key, flaky) in [
        ("a-1", "A", true),
        ("b-1", "B", false),
        ("b-2", "B", false),
        ("a-2", "A", false),
    ] {
        let body = format!(r#"{{"id":"{key}","flaky":{flaky}}}"#);
        producer
            .send_with_record_key(&topic, Some(key), Some(record_key), &body, None)
            .await;
    }
    let kafka = KafkaConsumer::builder(
        &setup.bootstrap,
        &setup.group(),
        &[&setup.topic],
        setup.consumer().await,
    )
    .consumer_set("session.timeout.ms", "6000")
    .partition_order(PartitionOrder::Keys { max_in_flight: 8 })
    .connect()
    .await
    .expect("connect");
    let stats = kafka.consumer().clone();
    let (stop, running) = run_orders(kafka, &setup.ledger);
    let done = eventually(Duration::from_secs(30), || {
        setup.ledger.effects().len() == 4
    })
    .await;
    let committed = setup.caught_up(1).await;
    stop.send(()).expect("stop");
    running.await.expect("task").expect("run");
    assert!(done, "{:?}", setup.ledger.effects());
    let order = setup.ledger.effects_in_order();
    let at = |key: &str| order.iter().position(|k| k == key).expect("ran");
    assert!(
        at("b-1") < at("b-2") && at("b-2") < at("a-1"),
        "key B went ahead while a-1 waited for its retry: {order:?}"
    );
    assert!(at("a-1") < at("a-2"), "key A kept its order: {order:?}");
    let stats = stats.stats();
    assert_eq!((stats.executed, stats.retries), (4, 1), "{stats:?}");
    assert!(
        committed,
        "committed past all four: {:?}",
        setup.progress(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_the_running_handler_finish_and_commits_its_offset() {
    let setup = Setup::new("shutdown", 1).await;
    let producer = setup.producer();
    producer
        .send(&setup.topic, Some("long-1"), r#"{"id":"long-1"}"#, None)
        .await;
    producer
        .send(&setup.topic, Some("next-1"), r#"{"id":"next-1"}"#, None)
        .await;
    let kafka = setup.kafka().await;
    let ledger = setup.ledger.clone();
    let (in_handler, entered) = oneshot::channel::<()>();
    let in_handler = Mutex::new(Some(in_handler));
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(kafka.run(
        move |job| {
            if let Some(tx) = in_handler.lock().expect("lock").take() {
                let _ = tx.send(());
            }
            let ledger = ledger.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                ledger.effect(job.key().as_str());
                Ok::<_, idem::Terminal>(())
            }
        },
        async {
            stopped.await.ok();
        },
    ));
    entered.await.expect("the first handler started");
    stop.send(()).expect("stop");
    let stopped = running.await.expect("task").expect("run");
    assert_eq!(stopped, Stopped::Shutdown);
    assert_eq!(
        setup.ledger.effects(),
        BTreeMap::from([("long-1".to_owned(), 1)]),
        "the running handler finished; the next record was not started"
    );
    assert_eq!(
        setup.progress(1)[&0],
        (1, 2),
        "the finished record was committed, the unstarted one was not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_configurations_that_could_lose_or_rerun_records() {
    let setup = Setup::new("config", 1).await;
    let builder = |topic: &str, consumer| {
        KafkaConsumer::builder(&setup.bootstrap, &setup.group(), &[topic], consumer)
    };

    let missing = builder("no-such-topic", setup.consumer().await)
        .connect()
        .await
        .expect_err("a missing topic is refused");
    assert!(
        matches!(&missing, KafkaConsumerError::TopicMissing { topic, .. } if topic == "no-such-topic"),
        "{missing}"
    );

    let forever = format!("{}-forever", setup.topic);
    create_topic(&setup.bootstrap, &forever, 1, &[("retention.ms", "-1")]).await;
    let unbounded = builder(&forever, setup.consumer().await)
        .connect()
        .await
        .expect_err("unbounded retention is refused");
    assert!(
        matches!(
            unbounded,
            KafkaConsumerError::Window(WindowError::Unbounded { .. })
        ),
        "{unbounded}"
    );

    let week = format!("{}-week", setup.topic);
    create_topic(&setup.bootstrap, &week, 1, &[("retention.ms", "604800000")]).await;
    let short = builder(&week, setup.consumer().await)
        .connect()
        .await
        .expect_err("records kept shorter than the topic are refused");
    assert!(
        matches!(
            &short,
            KafkaConsumerError::Window(WindowError::RetentionTooShort { setting, .. })
                if setting.contains("retention.ms")
        ),
        "{short}"
    );
    assert!(
        builder(&week, setup.consumer().await)
            .assume_redelivery_window(Duration::from_secs(3600))
            .connect()
            .await
            .is_ok(),
        "a stated redelivery window inside the record retention is accepted"
    );

    let early = builder(&setup.topic, setup.consumer().await)
        .consumer_set("enable.auto.offset.store", "true")
        .connect()
        .await
        .expect_err("storing offsets before processing is refused");
    assert!(
        matches!(&early, KafkaConsumerError::Setting { setting, .. } if setting == "enable.auto.offset.store"),
        "{early}"
    );

    let port = idem_testkit::servers::kafka::free_port().expect("port");
    let down = KafkaConsumer::builder(
        &format!("127.0.0.1:{port}"),
        "g",
        &[&setup.topic],
        setup.consumer().await,
    )
    .setup_timeout(Duration::from_secs(2))
    .connect()
    .await
    .expect_err("an unreachable broker is an error");
    assert!(matches!(down, KafkaConsumerError::Broker { .. }), "{down}");

    let kafka = builder(&setup.topic, setup.consumer().await)
        .connect()
        .await
        .expect("a sound configuration connects");
    assert_eq!(
        kafka.dead_letter_topic(&setup.topic),
        Some(setup.dead_letter_topic().as_str())
    );
}
