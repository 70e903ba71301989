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

use common::{create_topic, read_topic, Setup};
use idem_consumer::WindowError;
use idem_kafka::{
    KafkaConsumer, KafkaConsumerError, PartitionOrder, CONSUMER_HEADER, KEY_HEADER, REASON_HEADER,
    SOURCE_OFFSET_HEADER, SOURCE_PARTITION_HEADER, SOURCE_TOPIC_HEADER,
};
use idem_testkit::ledger::{eventually, order_handler};
use tokio::sync::oneshot;

/// Not a test on its own: the worker process the other tests start. It
/// consumes until it is killed.
#[test]
#[ignore = "a worker process, started by the multi-process tests"]
fn worker_process() {
    let Some(setup) = Setup::from_env() else {
        return;
    };
    let slow = std::env::var("IDEM_KAFKA_SLOW").ok();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async move {
            let kafka = setup.kafka().await;
            let ledger = setup.ledger.clone();
            kafka
                .run(
                    move |job| order_handler(job, ledger.clone(), slow.clone()),
                    std::future::pending(),
                )
                .await
                .expect("consume");
        });
}

/// Waits until the group's committed offset reaches the end of every
/// partition.
async fn caught_up(setup: &Setup, partitions: i32) -> bool {
    for _ in 0..150 {
        if setup
            .progress(partitions)
            .values()
            .all(|(at, end)| at == end)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_duplicates_retries_and_poison_end_with_one_effect_each() {
    let setup = Setup::new("kill", 3).await;
    let producer = setup.producer();
    let topic = setup.topic.clone();
    let plain: Vec<String> = (0..30).map(|i| format!("m-{i}")).collect();
    for key in &plain {
        let body = format!(r#"{{"id":"{key}"}}"#);
        producer.send(&topic, Some(key), &body, None).await;
        producer.send(&topic, Some(key), &body, None).await;
    }
    for (key, body) in [
        (Some("flaky-1"), r#"{"id":"flaky-1","flaky":true}"#),
        (Some("poison-1"), r#"{"id":"poison-1","poison":true}"#),
        (None, r#"{"id":"keyless"}"#),
        (Some("broken-1"), "{not json"),
        (Some("slow-1"), r#"{"id":"slow-1"}"#),
    ] {
        producer.send(&topic, key, body, None).await;
    }

    let mut a = setup.spawn_worker(Some("slow-1"));
    let started = eventually(Duration::from_secs(60), || {
        setup.ledger.started().contains_key("slow-1")
    })
    .await;
    assert!(started, "worker A started the slow message");
    a.kill().expect("SIGKILL worker A");
    a.wait().expect("reap worker A");

    let mut b = setup.spawn_worker(None);
    let mut c = setup.spawn_worker(None);
    let mut expected = plain.clone();
    expected.extend(["flaky-1".to_owned(), "slow-1".to_owned()]);
    let all_done = eventually(Duration::from_secs(120), || {
        let effects = setup.ledger.effects();
        expected.iter().all(|k| effects.contains_key(k))
    })
    .await;
    let committed = caught_up(&setup, 3).await;
    // Let any late duplicate show itself before judging.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for worker in [&mut b, &mut c] {
        worker.kill().expect("stop worker");
        worker.wait().expect("reap worker");
    }

    let effects = setup.ledger.effects();
    assert!(all_done, "every good message had its effect: {effects:?}");
    for key in &expected {
        assert_eq!(effects.get(key), Some(&1), "exactly one effect for {key}");
    }
    assert_eq!(
        effects.len(),
        expected.len(),
        "no effect for anything else (poison, keyless, broken): {effects:?}"
    );
    assert!(
        committed,
        "the group committed past every record: {:?}",
        setup.progress(3)
    );
    // A worker killed after a dead-letter copy but before its offset was
    // committed leaves the record to be dead-lettered again: copies are
    // at least once, and name their source record so readers can drop
    // repeats.
    let mut dead = read_topic(&setup.bootstrap, &setup.dead_letter_topic(), 8).await;
    dead.sort_by(|x, y| x.get(KEY_HEADER).cmp(&y.get(KEY_HEADER)));
    dead.dedup_by(|x, y| {
        x[SOURCE_PARTITION_HEADER] == y[SOURCE_PARTITION_HEADER]
            && x[SOURCE_OFFSET_HEADER] == y[SOURCE_OFFSET_HEADER]
    });
    assert_eq!(
        dead.len(),
        3,
        "dead-letters only for the bad ones: {dead:?}"
    );
    for d in &dead {
        assert_eq!(d[CONSUMER_HEADER], "orders");
        assert_eq!(d[SOURCE_TOPIC_HEADER], setup.topic);
        assert!(d[SOURCE_OFFSET_HEADER].parse::<i64>().is_ok(), "{d:?}");
    }
    assert_eq!(dead[0].get(KEY_HEADER), None);
    assert!(
        dead[0][REASON_HEADER].starts_with("no idempotency key"),
        "{dead:?}"
    );
    assert_eq!(dead[1][KEY_HEADER], "broken-1");
    assert!(
        dead[1][REASON_HEADER].contains("payload is not a valid"),
        "{dead:?}"
    );
    assert_eq!(dead[2][KEY_HEADER], "poison-1");
    assert!(
        dead[2][REASON_HEADER].contains("cannot ship to the moon"),
        "{dead:?}"
    );
    assert_eq!(
        dead[2]["Idempotency-Key"], "poison-1",
        "the original headers travel with the copy"
    );
}

/// One group member's run, as a task that can be stopped.
struct Member {
    stop: oneshot::Sender<()>,
    running: tokio::task::JoinHandle<idem_consumer::ConsumerStats>,
    consumer: idem_consumer::Consumer<idem_redis::RedisStore>,
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
    let committed = caught_up(&setup, 4).await;
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
    let ledger = setup.ledger.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let stats = kafka.consumer().clone();
    let running = tokio::spawn(kafka.run(
        move |job| order_handler(job, ledger.clone(), None),
        async {
            stopped.await.ok();
        },
    ));
    let done = eventually(Duration::from_secs(30), || {
        setup.ledger.effects().len() == 3
    })
    .await;
    stop.send(()).expect("stop");
    running.await.expect("task").expect("run");
    assert!(done, "{:?}", setup.ledger.effects());
    let lines = std::fs::read_to_string(setup.ledger.dir().join("effects")).expect("ledger");
    assert_eq!(
        lines.lines().collect::<Vec<_>>(),
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
    let ledger = setup.ledger.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let stats = kafka.consumer().clone();
    let running = tokio::spawn(kafka.run(
        move |job| order_handler(job, ledger.clone(), None),
        async {
            stopped.await.ok();
        },
    ));
    let done = eventually(Duration::from_secs(30), || {
        setup.ledger.effects().len() == 4
    })
    .await;
    let committed = caught_up(&setup, 1).await;
    stop.send(()).expect("stop");
    running.await.expect("task").expect("run");
    assert!(done, "{:?}", setup.ledger.effects());
    let lines = std::fs::read_to_string(setup.ledger.dir().join("effects")).expect("ledger");
    let order: Vec<&str> = lines.lines().collect();
    let at = |key: &str| order.iter().position(|k| *k == key).expect("ran");
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
    assert_eq!(stopped, idem_consumer::Stopped::Shutdown);
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
        .err()
        .expect("a missing topic is refused");
    assert!(
        matches!(&missing, KafkaConsumerError::TopicMissing { topic, .. } if topic == "no-such-topic"),
        "{missing}"
    );

    let forever = format!("{}-forever", setup.topic);
    create_topic(&setup.bootstrap, &forever, 1, &[("retention.ms", "-1")]).await;
    let unbounded = builder(&forever, setup.consumer().await)
        .connect()
        .await
        .err()
        .expect("unbounded retention is refused");
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
        .err()
        .expect("records kept shorter than the topic are refused");
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
        .err()
        .expect("storing offsets before processing is refused");
    assert!(
        matches!(&early, KafkaConsumerError::Setting { setting, .. } if setting == "enable.auto.offset.store"),
        "{early}"
    );

    let port = idem_testkit::kafka::free_port().expect("port");
    let down = KafkaConsumer::builder(
        &format!("127.0.0.1:{port}"),
        "g",
        &[&setup.topic],
        setup.consumer().await,
    )
    .setup_timeout(Duration::from_secs(2))
    .connect()
    .await
    .err()
    .expect("an unreachable broker is an error");
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
