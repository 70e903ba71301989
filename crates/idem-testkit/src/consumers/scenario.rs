//! The worker-kill scenario every broker adapter's tests run, so that each
//! adapter is held to the same proof: the same messages, the same
//! choreography of worker processes, the same judgement.
//!
//! The messages: 30 orders, each published twice, a flaky order (fails on
//! its first attempt), a poison order (fails terminally), a message
//! without a key, a payload that is not JSON, and a slow order. Worker A
//! hangs on the slow order and, once it has nothing else in hand, is
//! killed with SIGKILL in the middle of that handler; workers B and C
//! finish the job. Every good order must
//! have exactly one effect, nothing else any effect, and the dead-letter
//! destination exactly the poison, keyless and broken messages.
//!
//! Workers are the test binary itself, started again to run only its
//! ignored test `worker_process` with [`order_handler`](crate::consumers::ledger::order_handler).
//!
//! An adapter's tests implement [`BrokerUnderTest`] and run the scenario
//! with two lines each: a worker entry point, marked `#[test]` and
//! `#[ignore = "a worker process, started by the multi-process tests"]`,
//! and the scenario, marked
//! `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`. Here
//! they are written for any `B` (an adapter names its own type):
//!
//! ```
//! use idem_testkit::consumers::scenario;
//! use idem_testkit::consumers::under_test::BrokerUnderTest;
//!
//! pub fn worker_process<B: BrokerUnderTest>() {
//!     scenario::worker_process::<B>();
//! }
//!
//! pub async fn a_killed_worker_duplicates_retries_and_poison_end_with_one_effect_each<
//!     B: BrokerUnderTest,
//! >() {
//!     scenario::killed_worker::<B>("kill").await;
//! }
//! ```

use std::ffi::OsStr;
use std::future::Future;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem::{Backoff, Idempotency, Store};

use crate::consumers::ledger::{eventually, Ledger, Work};
use crate::consumers::under_test::{BrokerUnderTest, DeadLetterSeen};

/// The environment variable telling a worker process which key to hang on.
pub const SLOW_VAR: &str = "IDEM_WORKER_SLOW";

/// The environment variable telling a worker process to run the
/// [fenced handler](Work::Fenced).
pub const FENCED_VAR: &str = "IDEM_WORKER_FENCED";

/// The environment variable telling a worker process to run a
/// [pipeline](Work::Pipeline) (both hops).
pub const PIPELINE_VAR: &str = "IDEM_WORKER_PIPELINE";

/// The environment variable naming a chaos run's worker slot: a worker
/// that replaces a killed or departed one is given the same name, so a
/// broker with static group membership (Kafka's `group.instance.id`)
/// hands it its predecessor's partitions without a rebalance.
pub const MEMBER_VAR: &str = "IDEM_WORKER_MEMBER";

/// In a worker process: the name of its slot in a chaos run, if it has
/// one ([`MEMBER_VAR`]).
pub fn member() -> Option<String> {
    std::env::var(MEMBER_VAR).ok()
}

/// The key worker A hangs on.
pub const SLOW_KEY: &str = "slow-1";

/// Starts this test binary again as a worker process running only its
/// ignored test `worker_process`, with `env` and the handler `work`; its
/// output is discarded, its errors shown.
pub fn spawn_worker<I, K, V>(env: I, work: &Work) -> Child
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args(["--exact", "worker_process", "--ignored", "--nocapture"])
        .env_remove(SLOW_VAR)
        .env_remove(FENCED_VAR)
        .env_remove(PIPELINE_VAR)
        .env_remove(MEMBER_VAR)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    match work {
        Work::Orders { slow: Some(key) } => {
            command.env(SLOW_VAR, key);
        }
        Work::Orders { slow: None } => {}
        Work::Fenced => {
            command.env(FENCED_VAR, "1");
        }
        Work::Pipeline(_) => {
            command.env(PIPELINE_VAR, "1");
        }
    }
    command.spawn().expect("spawn worker")
}

/// The lease of the scenario's [`executor`].
pub const LEASE: Duration = Duration::from_secs(2);

/// The executor the scenario's consumers run: a two-second lease (a
/// killed worker's claims are taken over within seconds) renewed every
/// half second, twenty attempts (every takeover counts one, and a key
/// taken over again and again by the chaos run's faults is still worked
/// on, not failed for good), backoff from 100 to 500 ms.
pub fn executor<S: Store>(store: S) -> Idempotency<S> {
    executor_with(store, None)
}

/// [`executor`], with the run outbox sending through `outbox` when
/// given.
pub fn executor_with<S: Store>(
    store: S,
    outbox: Option<std::sync::Arc<dyn idem::outbox::Sender>>,
) -> Idempotency<S> {
    let builder = Idempotency::builder(store)
        .lease(LEASE)
        .heartbeat(Duration::from_millis(500))
        .max_attempts(std::num::NonZeroU32::new(20).expect("non-zero"))
        .backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(500),
        ));
    match outbox {
        Some(sender) => builder.outbox(sender),
        None => builder,
    }
    .build()
    .expect("config")
}

/// The executor a consumer of `work` runs ([`executor`]), and for a
/// pipeline's first hop with the run outbox sending through the hop's
/// sender (noted in `ledger`) and its dispatcher, looking once a lease,
/// running until the handle is dropped.
pub fn executor_for<S>(
    work: &Work,
    store: S,
    ledger: &Ledger,
) -> (Idempotency<S>, Option<idem::PurgerHandle>)
where
    S: Store + idem::ListRecords + idem::FindAbandoned + Clone,
{
    let Work::Pipeline(hop) = work else {
        return (executor(store), None);
    };
    let idem = executor_with(store, Some(hop.noted(ledger)));
    // Once a lease: a pass lists the store's markers, a scan on DynamoDB,
    // and the SQS runs' store is a moto that serves one request at a time.
    let dispatcher = idem.spawn_outbox_dispatcher(LEASE);
    (idem, Some(dispatcher))
}

/// How long a worker process whose stdin closed may take to stop cleanly
/// before it exits anyway.
pub const WORKER_GRACE: Duration = Duration::from_secs(15);

/// A worker process's main: runs `work` on a multi-threaded runtime,
/// handing it a shutdown future that resolves when the process's stdin
/// closes. The parent closes it to make the worker leave cleanly
/// ([`Child::stdin`] dropped); it also closes when the parent is gone,
/// even if it died without killing its workers. A worker that has not
/// stopped [`WORKER_GRACE`] later exits anyway.
pub fn worker_main<F>(work: impl FnOnce(Pin<Box<dyn Future<Output = ()> + Send>>) -> F)
where
    F: Future<Output = ()>,
{
    let (closed, shutdown) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
        let _ = closed.send(());
        std::thread::sleep(WORKER_GRACE);
        std::process::exit(0);
    });
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(work(Box::pin(async {
            let _ = shutdown.await;
        })));
}

/// In a worker process: the handler its parent chose.
pub fn work() -> Work {
    if std::env::var_os(FENCED_VAR).is_some() {
        return Work::Fenced;
    }
    Work::Orders {
        slow: std::env::var(SLOW_VAR).ok(),
    }
}

/// The scenario's messages in publishing order, as (`Idempotency-Key`,
/// payload).
pub fn messages() -> Vec<(Option<String>, String)> {
    let mut messages = Vec::new();
    for i in 0..30 {
        let key = format!("m-{i}");
        let body = format!(r#"{{"id":"{key}"}}"#);
        messages.push((Some(key.clone()), body.clone()));
        messages.push((Some(key), body));
    }
    for (key, body) in [
        (Some("flaky-1"), r#"{"id":"flaky-1","flaky":true}"#),
        (Some("poison-1"), r#"{"id":"poison-1","poison":true}"#),
        (None, r#"{"id":"keyless"}"#),
        (Some("broken-1"), "{not json"),
        (Some(SLOW_KEY), r#"{"id":"slow-1"}"#),
    ] {
        messages.push((key.map(str::to_owned), body.to_owned()));
    }
    messages
}

/// The keys that must end with exactly one effect.
pub fn expected_effects() -> Vec<String> {
    let mut keys: Vec<String> = (0..30).map(|i| format!("m-{i}")).collect();
    keys.extend(["flaky-1".to_owned(), SLOW_KEY.to_owned()]);
    keys
}

/// Runs the workers over the published messages: A (started by `spawn`
/// with the slow key) is SIGKILLed once it has started the slow order;
/// B and C run until every expected effect is in the ledger or `limit`
/// passes; then `settled` runs (the adapter's check that the broker holds
/// nothing unsettled) while they still run, and after a pause for late
/// duplicates they are stopped. Asserts one effect per good order and no
/// other effect, and returns what `settled` returned.
pub async fn kill_one_worker_and_finish<T>(
    ledger: &Ledger,
    limit: Duration,
    spawn: impl Fn(Option<&str>) -> Child,
    settled: impl Future<Output = T>,
) -> T {
    let mut a = spawn(Some(SLOW_KEY));
    let started = eventually(Duration::from_secs(60), || {
        ledger.started().contains_key(SLOW_KEY)
    })
    .await;
    if !started {
        let _ = a.kill();
        let _ = a.wait();
    }
    assert!(started, "worker A started the slow message");
    // A works on other orders beside the slow one. Killed between one of
    // their effects and its stored completion, A would leave that order to
    // run again after the lease: the at-least-once window of an effect
    // outside the store, which is not what this scenario judges (the
    // chaos runs fence such effects). So A is killed once it has done
    // nothing else for a while: only the slow order is in its hands.
    let quiet = quiet_for(ledger, Duration::from_secs(3), Duration::from_secs(60)).await;
    if !quiet {
        let _ = a.kill();
        let _ = a.wait();
    }
    assert!(
        quiet,
        "worker A went quiet with only the slow message in hand"
    );
    a.kill().expect("SIGKILL worker A");
    a.wait().expect("reap worker A");

    let mut b = spawn(None);
    let mut c = spawn(None);
    let expected = expected_effects();
    let all_done = eventually(limit, || {
        let effects = ledger.effects();
        expected.iter().all(|k| effects.contains_key(k))
    })
    .await;
    let settled = settled.await;
    // Let any late duplicate show itself before judging.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for worker in [&mut b, &mut c] {
        worker.kill().expect("stop worker");
        worker.wait().expect("reap worker");
    }

    let effects = ledger.effects();
    assert!(all_done, "every good message had its effect: {effects:?}");
    for key in &expected {
        assert_eq!(effects.get(key), Some(&1), "exactly one effect for {key}");
    }
    assert_eq!(
        effects.len(),
        expected.len(),
        "no effect for anything else (poison, keyless, broken): {effects:?}"
    );
    settled
}

/// Waits until the ledger has not changed for `quiet`, at most `limit`;
/// whether it got there.
async fn quiet_for(ledger: &Ledger, quiet: Duration, limit: Duration) -> bool {
    let snapshot = || (ledger.started(), ledger.effects());
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = snapshot();
    let mut since = tokio::time::Instant::now();
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = snapshot();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return true;
        }
    }
    false
}

/// Asserts that the dead-letters, as (key, reason), are exactly the
/// poison, keyless and broken messages, each with its reason.
///
/// Copies are counted once per key: a worker killed after a dead-letter
/// copy was confirmed but before the original was settled leaves the
/// message to be delivered, and dead-lettered, again. Dead-lettering is at
/// least once by design (never lost); the scenario's bad messages each
/// have a key of their own, and one has none.
pub fn assert_bad_ones_dead(mut dead: Vec<(Option<String>, String)>) {
    dead.sort();
    dead.dedup_by(|x, y| x.0 == y.0);
    assert_eq!(
        dead.len(),
        3,
        "dead-letters only for the bad ones: {dead:?}"
    );
    assert_eq!(dead[0].0, None);
    assert!(dead[0].1.starts_with("no idempotency key"), "{dead:?}");
    assert_eq!(dead[1].0.as_deref(), Some("broken-1"));
    assert!(dead[1].1.contains("payload is not a valid"), "{dead:?}");
    assert_eq!(dead[2].0.as_deref(), Some("poison-1"));
    assert!(dead[2].1.contains("cannot ship to the moon"), "{dead:?}");
}

/// The body of an adapter's ignored `worker_process` test: consumes the
/// setup its parent passed until it is killed or its stdin closes (then
/// it stops cleanly, see [`worker_main`]); does nothing when the binary
/// runs as a plain test.
pub fn worker_process<B: BrokerUnderTest>() {
    let Some(setup) = B::from_env() else {
        return;
    };
    worker_main(|shutdown| async move { setup.consume(work(), shutdown).await });
}

/// The whole worker-kill scenario on broker `B`: publishes
/// [`messages`], runs [`kill_one_worker_and_finish`], and asserts that
/// the broker settled everything and dead-lettered exactly the bad ones,
/// each naming the consumer.
pub async fn killed_worker<B: BrokerUnderTest>(name: &str) {
    let setup = B::create(name).await;
    for (key, body) in messages() {
        setup.publish(key.as_deref(), &body).await;
    }
    let env = setup.env();
    let settled = kill_one_worker_and_finish(
        setup.ledger(),
        Duration::from_secs(120),
        |slow| {
            let slow = slow.map(str::to_owned);
            spawn_worker(env.clone(), &Work::Orders { slow })
        },
        setup.settled(3),
    )
    .await;
    assert!(settled, "the broker holds nothing unsettled");
    assert_dead_letters(setup.dead_letters().await);
}

/// [`assert_bad_ones_dead`] on dead-letters read back from a broker,
/// after checking that each names the consumer (`orders`).
pub fn assert_dead_letters(dead: Vec<DeadLetterSeen>) {
    for letter in &dead {
        assert_eq!(letter.consumer.as_deref(), Some("orders"), "{letter:?}");
    }
    assert_bad_ones_dead(dead.into_iter().map(|d| (d.key, d.reason)).collect());
}

/// An adapter's worker-kill test over its [`BrokerUnderTest`] `$setup`
/// (the destination named after `$name`): the worker process the
/// scenario starts and [`killed_worker`] as a test.
#[macro_export]
macro_rules! killed_worker_test {
    ($setup:ty, $name:expr) => {
        /// Not a test on its own: the worker process the other tests
        /// start. It consumes until it is killed.
        #[test]
        #[ignore = "a worker process, started by the multi-process tests"]
        fn worker_process() {
            $crate::consumers::scenario::worker_process::<$setup>();
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_killed_worker_duplicates_retries_and_poison_end_with_one_effect_each() {
            $crate::consumers::scenario::killed_worker::<$setup>($name).await;
        }
    };
}
