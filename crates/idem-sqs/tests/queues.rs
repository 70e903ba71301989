//! The SQS adapter against moto_server (SQS and, for the store, DynamoDB,
//! started for this test run on a free loopback port).
//!
//! The main case runs workers as separate processes of this test binary
//! and kills one with SIGKILL (by PID) in the middle of a handler; an
//! effects ledger on disk, written by the handlers, shows one effect per
//! message, none lost, and dead-letters only for the bad ones.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use idem::{Idempotency, Scope};
use idem_consumer::{Consumer, KeyExtractor, WindowError};
use idem_sqs::{SqsConsumer, SqsError};
use idem_testkit::consumers::ledger::{eventually, order_handler};
use idem_testkit::consumers::scenario;
use idem_testkit::servers::moto::MotoServer;

use common::{dead_letters, Setup};

idem_testkit::killed_worker_test!(Setup, "kill");

/// A FIFO queue deduplicates for five minutes only, and only by the
/// deduplication id: the same order sent with two ids (a producer retry
/// after the window, say) is delivered twice, and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_queue_runs_each_order_once_past_its_own_deduplication() {
    let setup = Setup::new("fifo", true).await;
    for i in 0..10 {
        let key = format!("f-{i}");
        let body = format!(r#"{{"id":"{key}"}}"#);
        setup
            .send(Some(&key), &body, Some(&format!("{key}-a")))
            .await;
        setup
            .send(Some(&key), &body, Some(&format!("{key}-b")))
            .await;
    }
    setup
        .send(
            Some("poison-1"),
            r#"{"id":"poison-1","poison":true}"#,
            Some("p"),
        )
        .await;
    setup.send(None, r#"{"id":"keyless"}"#, Some("k")).await;
    setup.send(Some("broken-1"), "{not json", Some("b")).await;

    let sqs = setup.sqs().await;
    assert!(sqs.dead_letter_queue().ends_with("-dead.fifo"));
    let ledger = setup.ledger.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        sqs.run(move |job| order_handler(job, ledger.clone(), None), async {
            stopped.await.ok();
        })
        .await
        .map(|()| sqs.consumer().stats())
    });
    let done = eventually(Duration::from_secs(60), || {
        setup.ledger.effects().len() == 10
    })
    .await;
    for _ in 0..100 {
        if setup.remaining().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.send(()).expect("stop");
    let stats = running.await.expect("task").expect("run");
    assert!(done, "every order ran: {:?}", setup.ledger.effects());
    assert!(
        setup.ledger.effects().values().all(|n| *n == 1),
        "once each: {:?}",
        setup.ledger.effects()
    );
    assert_eq!((stats.executed, stats.replayed), (10, 10), "{stats:?}");
    assert_eq!(setup.remaining().await, 0, "every message was deleted");
    let dead_url = setup.queue_url.replace(".fifo", "-dead.fifo");
    scenario::assert_dead_letters(dead_letters(&setup.client(), &dead_url).await);
}

/// A handler more than twice as long as its queue's visibility timeout:
/// the heartbeat's visibility extensions keep the message from every
/// other receiver until it is done. A second receiver polls the queue the
/// whole time and must get nothing, and the consumer itself must not meet
/// its own message in progress. On a moto of its own, with a 3 s
/// visibility timeout: on the shared one, the other cases' worker
/// processes delayed an extension past a 2 s timeout in two runs of six
/// (SQS then delivers the message again, and the claim in progress
/// keeps the handler from running twice, which is not what this case is
/// about).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_longer_than_the_visibility_timeout_keeps_its_message_hidden() {
    let moto = tokio::task::spawn_blocking(MotoServer::start)
        .await
        .expect("task")
        .expect("moto_server must be installed (scripts/test installs it)");
    let setup = Setup::on(moto.url(), "long", false, 3).await;
    setup.send(Some("long-1"), r#"{"id":"long-1"}"#, None).await;
    let consumer = Consumer::builder(setup.idem(), Scope::new("orders").expect("scope"))
        .keys(KeyExtractor::header("Idempotency-Key"))
        .build();
    let sqs = SqsConsumer::builder(setup.client(), &setup.queue_url, consumer)
        .concurrency(1)
        .wait_time(Duration::from_secs(1))
        .connect()
        .await
        .expect("connect to SQS");
    let ran = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let (ran, done) = (Arc::clone(&ran), Arc::clone(&done));
        tokio::spawn(async move {
            sqs.run(
                move |job| {
                    let (ran, done) = (Arc::clone(&ran), Arc::clone(&done));
                    async move {
                        ran.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(8)).await;
                        job.ctx().ensure_lease().map_err(std::io::Error::other)?;
                        done.store(true, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(())
                    }
                },
                async {
                    stopped.await.ok();
                },
            )
            .await
            .map(|()| sqs.consumer().stats())
        })
    };
    // The spy starts once the handler runs: before that, it could win the
    // first receive from the consumer, which is a race, not a redelivery.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ran.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spy = setup.client();
    let mut seen_by_spy = 0;
    while !done.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        seen_by_spy += spy
            .receive_message()
            .queue_url(&setup.queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(1)
            .send()
            .await
            .expect("receive")
            .messages
            .unwrap_or_default()
            .len();
    }
    for _ in 0..50 {
        if setup.remaining().await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.send(()).expect("stop");
    let stats = running.await.expect("task").expect("run");
    assert!(done.load(Ordering::SeqCst), "the handler finished");
    assert_eq!(
        seen_by_spy, 0,
        "the message was received again while its handler ran"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(
        (stats.executed, stats.in_flight_conflicts),
        (1, 0),
        "{stats:?}"
    );
    assert_eq!(setup.remaining().await, 0, "the message was deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_refuses_configurations_that_could_lose_or_rerun_messages() {
    let setup = Setup::new("config", false).await;
    let scope = || Scope::new("orders").expect("scope");

    // Records kept for 10 minutes, messages for an hour: a duplicate
    // delivered after 10 minutes would run again.
    let short = Idempotency::builder(setup.store())
        .retention(Duration::from_secs(600))
        .build()
        .expect("config");
    let err = SqsConsumer::builder(
        setup.client(),
        &setup.queue_url,
        Consumer::builder(short, scope()).build(),
    )
    .connect()
    .await
    .expect_err("retention shorter than the queue's");
    assert!(
        matches!(err, SqsError::Window(WindowError::RetentionTooShort { .. })),
        "{err}"
    );

    // A heartbeat slower than the visibility timeout lets SQS redeliver a
    // message whose handler is still running.
    let slow = Idempotency::builder(setup.store())
        .lease(Duration::from_secs(30))
        .heartbeat(Duration::from_secs(10))
        .build()
        .expect("config");
    let err = SqsConsumer::builder(
        setup.client(),
        &setup.queue_url,
        Consumer::builder(slow, scope()).build(),
    )
    .connect()
    .await
    .expect_err("heartbeat slower than the visibility timeout");
    assert!(
        matches!(err, SqsError::Window(WindowError::HeartbeatTooSlow { .. })),
        "{err}"
    );

    // SQS's own redrive would move messages without a reason.
    let client = setup.client();
    redrive(&setup, 5).await;
    let consumer = || Consumer::builder(setup.idem(), scope()).build();
    let err = SqsConsumer::builder(client.clone(), &setup.queue_url, consumer())
        .connect()
        .await
        .expect_err("redrive policy");
    assert!(
        matches!(&err, SqsError::Config(text) if text.contains("RedrivePolicy")),
        "{err}"
    );
    SqsConsumer::builder(client.clone(), &setup.queue_url, consumer())
        .accept_redrive_policy()
        .connect()
        .await
        .expect("accepted when asked");

    let err = SqsConsumer::builder(client, &format!("{}-missing", setup.queue_url), consumer())
        .connect()
        .await
        .expect_err("no such queue");
    assert!(
        matches!(&err, SqsError::Request { what, .. } if what.contains("-missing")),
        "{err}"
    );
}

/// With a `RedrivePolicy` accepted, SQS would move a message aside after
/// `maxReceiveCount` receives without a reason: the last receive is
/// dead-lettered by idem with the reason instead of run; a message on an
/// earlier receive runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_redrive_policy_the_last_receive_is_dead_lettered_with_the_reason() {
    let setup = Setup::new("redrive-last", false).await;
    let client = setup.client();
    redrive(&setup, 2).await;

    // r-1 is received once and not deleted (a worker that died): its
    // next receive is its second, the last.
    setup.send(Some("r-1"), r#"{"id":"r-1"}"#, None).await;
    let first = client
        .receive_message()
        .queue_url(&setup.queue_url)
        .visibility_timeout(0)
        .wait_time_seconds(1)
        .send()
        .await
        .expect("receive")
        .messages
        .unwrap_or_default();
    assert_eq!(first.len(), 1, "r-1 received once");
    setup.send(Some("r-2"), r#"{"id":"r-2"}"#, None).await;

    let consumer = Consumer::builder(setup.idem(), Scope::new("orders").expect("scope"))
        .keys(KeyExtractor::header("Idempotency-Key"))
        .build();
    let sqs = SqsConsumer::builder(client.clone(), &setup.queue_url, consumer)
        .accept_redrive_policy()
        .wait_time(Duration::from_secs(1))
        .connect()
        .await
        .expect("accepted when asked");
    let dead_url = sqs.dead_letter_queue().to_owned();
    let ran = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let handler = {
        let ran = Arc::clone(&ran);
        move |job: idem_consumer::Job<idem_sqs::SqsMessage>| {
            ran.lock()
                .expect("lock")
                .push(job.key().as_str().to_owned());
            async { Ok::<_, idem::Terminal>(()) }
        }
    };
    let stats = sqs.consumer().clone();
    sqs.run(handler, async move {
        eventually(Duration::from_secs(30), || {
            let s = stats.stats();
            s.executed + s.dead_letters >= 2
        })
        .await;
    })
    .await
    .expect("a clean stop");

    assert_eq!(
        *ran.lock().expect("lock"),
        ["r-2"],
        "r-1's last receive did not run"
    );
    let dead = dead_letters(&client, &dead_url).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].key.as_deref(), Some("r-1"));
    assert!(
        dead[0].reason.contains("delivery 2 is the last"),
        "{}",
        dead[0].reason
    );
}

/// Gives `setup`'s queue SQS's own `RedrivePolicy`, moving a message to a
/// new queue after `max_receives` receives.
async fn redrive(setup: &Setup, max_receives: u32) {
    let client = setup.client();
    let elsewhere = client
        .create_queue()
        .queue_name(format!("elsewhere-{:08x}", rand::random::<u32>()))
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("url");
    let arn = client
        .get_queue_attributes()
        .queue_url(&elsewhere)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("attributes")
        .attributes
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .expect("arn");
    client
        .set_queue_attributes()
        .queue_url(&setup.queue_url)
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receives}"}}"#),
        )
        .send()
        .await
        .expect("set redrive policy");
}
