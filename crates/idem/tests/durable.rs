//! Durable handlers and the completer on the memory store: a run cut off
//! mid-handler is finished by a sweep with its journaled input, steps
//! already done are not repeated, records without an input are released,
//! concurrent completers re-drive each record once, a handler that keeps
//! dying runs out of attempts, and every refusal is typed. (Over real
//! PostgreSQL with SIGKILLed worker processes: idem-postgres's
//! `steps_crash` test.)

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::durable::{Completer, Durable, Sweep, INPUT_STEP};
use idem::step::{Park, Retry, StepError};
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{
    ConfigError, Context, FailureClass, Fingerprint, GetRecord, Idempotency, Key, ManualClock,
    MemoryStore, Outcome, RecordId, RunError, Scope, State, StepJournal, Store, Timestamp,
};
use idem_testkit::doubles::{Double, NoJournal};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

type Io = std::io::Error;
type Mem = MemoryStore<ManualClock>;

const LEASE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
    amount: u64,
}

#[derive(Debug, thiserror::Error)]
enum OrderError {
    #[error(transparent)]
    Step(#[from] StepError<Io>),
}

/// Counts what the handler did, and can make an attempt hang at the end
/// (a worker that is then cut off) or panic.
#[derive(Default)]
struct World {
    runs: AtomicU32,
    charges: Mutex<Vec<u32>>,
    inputs: Mutex<Vec<Order>>,
    hang_on_attempt: Mutex<HashSet<u32>>,
    panic_on_attempt: Mutex<HashSet<u32>>,
    reached_end: Notify,
}

fn setup() -> (ManualClock, Mem, Idempotency<Mem>) {
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let idem = Idempotency::builder(store.clone())
        .lease(LEASE)
        .max_attempts(3.try_into().expect("non-zero"))
        .max_response_bytes(1024)
        .build()
        .expect("config");
    (clock, store, idem)
}

fn orders(idem: &Idempotency<Mem>, world: &Arc<World>) -> Durable<Mem, Order, String, OrderError> {
    let world = Arc::clone(world);
    idem.durable(
        Scope::new("orders").expect("valid"),
        move |order: Order, ctx: Context| {
            let world = Arc::clone(&world);
            async move {
                world.runs.fetch_add(1, Ordering::SeqCst);
                world.inputs.lock().push(order.clone());
                let charged = ctx
                    .step("charge", Retry, |_| async {
                        world.charges.lock().push(order.id);
                        Ok::<_, Io>(format!("ch_{}", order.id))
                    })
                    .await?;
                let attempt = ctx.attempt();
                assert!(
                    !world.panic_on_attempt.lock().contains(&attempt),
                    "attempt {attempt} was set to panic"
                );
                if world.hang_on_attempt.lock().contains(&attempt) {
                    world.reached_end.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok(format!("{charged} for {}", order.amount))
            }
        },
    )
    .expect("the memory store keeps a journal")
}

fn key(k: &str) -> Key {
    Key::new(k).expect("valid")
}

fn id(k: &str) -> RecordId {
    RecordId::parse("orders", k).expect("valid")
}

/// Starts `order` on a worker that hangs after its charge step, and cuts
/// the worker off there (its future is dropped, as a crash would).
async fn cut_off(
    durable: &Durable<Mem, Order, String, OrderError>,
    world: &World,
    k: &str,
    order: Order,
) {
    world.hang_on_attempt.lock().insert(1);
    let running = {
        let durable = durable.clone();
        let k = key(k);
        tokio::spawn(async move { durable.run(&k, order).await })
    };
    world.reached_end.notified().await;
    running.abort();
    assert!(running.await.expect_err("aborted").is_cancelled());
    world.hang_on_attempt.lock().remove(&1);
}

#[tokio::test]
async fn a_run_cut_off_mid_handler_is_finished_by_a_sweep_without_repeating_its_steps() {
    let (clock, store, idem) = setup();
    let world = Arc::new(World::default());
    let durable = orders(&idem, &world);
    let completer = Completer::new().register(&durable);
    let order = Order {
        id: 7,
        amount: 4200,
    };
    cut_off(&durable, &world, "o-7", order.clone()).await;

    let swept = completer.sweep().await;
    assert_eq!(swept.found, 0, "a live lease is left alone: {swept:?}");
    assert_eq!(world.runs.load(Ordering::SeqCst), 1);

    clock.advance(LEASE);
    let swept = completer.sweep().await;
    assert_eq!((swept.found, swept.completed), (1, 1), "{swept:?}");
    assert_eq!(
        world.runs.load(Ordering::SeqCst),
        2,
        "the handler ran again"
    );
    assert_eq!(
        *world.inputs.lock(),
        vec![order.clone(), order.clone()],
        "with the journaled input"
    );
    assert_eq!(
        *world.charges.lock(),
        vec![7],
        "the finished charge step was replayed"
    );

    let record = store.get(&id("o-7")).await.expect("get").expect("present");
    assert!(
        matches!(record.state, State::Completed { .. }),
        "{record:?}"
    );
    assert_eq!(record.attempt, 2);
    let replayed = durable.run(&key("o-7"), order).await.expect("replay");
    assert_eq!(
        replayed,
        Outcome::Replayed {
            value: "ch_7 for 4200".into()
        }
    );
    assert_eq!(world.runs.load(Ordering::SeqCst), 2);
    assert_eq!(completer.sweep().await.found, 0, "nothing left to do");
}

/// A listing is old by the time a record's turn comes. A record released
/// meanwhile (here a delivery took it over and failed, to be retried after
/// its backoff) is left to its next delivery: the completer does not run
/// it again (issue 26, item 5).
#[tokio::test]
async fn a_record_released_after_the_listing_is_not_redriven() {
    let (clock, store, idem) = setup();
    let runs: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
    let held: Arc<Mutex<Option<u32>>> = Arc::default();
    let (at_gate, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let durable = {
        let (runs, held) = (Arc::clone(&runs), Arc::clone(&held));
        let (at_gate, gate) = (Arc::clone(&at_gate), Arc::clone(&gate));
        idem.durable(
            Scope::new("orders").expect("valid"),
            move |order: Order, ctx: Context| {
                let (runs, held) = (Arc::clone(&runs), Arc::clone(&held));
                let (at_gate, gate) = (Arc::clone(&at_gate), Arc::clone(&gate));
                async move {
                    let attempt = ctx.attempt();
                    runs.lock().push((order.id, attempt));
                    if attempt == 1 {
                        // The first workers are cut off here.
                        std::future::pending::<()>().await;
                    }
                    let first_redrive = held.lock().get_or_insert(order.id) == &order.id;
                    if !first_redrive {
                        return Err(Io::other("declined for now; retry later"));
                    }
                    at_gate.notify_one();
                    gate.notified().await;
                    Ok::<_, Io>(format!("shipped {}", order.id))
                }
            },
        )
        .expect("the memory store keeps a journal")
    };
    let order = |id| Order { id, amount: 1 };
    for n in [1, 2] {
        let durable = durable.clone();
        let started =
            tokio::spawn(async move { durable.run(&key(&format!("o-{n}")), order(n)).await });
        while !runs.lock().contains(&(n, 1)) {
            tokio::task::yield_now().await;
        }
        started.abort();
    }
    clock.advance(LEASE);

    // One record at a time: the second waits, listed, while the first runs.
    let completer = Completer::new().register(&durable).concurrency(1);
    let sweep = tokio::spawn(async move { completer.sweep().await });
    at_gate.notified().await;
    let first = held.lock().expect("a re-drive is running");
    let other = 3 - first;
    let delivered = durable.run(&key(&format!("o-{other}")), order(other)).await;
    assert!(
        matches!(
            delivered,
            Err(RunError::Handler {
                class: FailureClass::Retryable,
                ..
            })
        ),
        "{delivered:?}"
    );
    let released = store
        .get(&id(&format!("o-{other}")))
        .await
        .expect("get")
        .expect("present");
    assert!(
        matches!(released.state, State::Released { .. }),
        "{released:?}"
    );
    gate.notify_one();
    let swept = sweep.await.expect("sweep");

    assert_eq!((swept.found, swept.completed), (2, 1), "{swept:?}");
    assert!(
        !runs.lock().contains(&(other, 3)),
        "the released record was run again by the completer: {:?}",
        runs.lock()
    );
    let still = store
        .get(&id(&format!("o-{other}")))
        .await
        .expect("get")
        .expect("present");
    assert!(
        matches!(still.state, State::Released { .. }),
        "left to its next delivery: {still:?}"
    );
}

#[tokio::test]
async fn the_input_is_journaled_under_a_reserved_name_and_binds_the_key() {
    let (_clock, store, idem) = setup();
    let world = Arc::new(World::default());
    let durable = orders(&idem, &world);
    let order = Order { id: 1, amount: 5 };
    durable.run(&key("o-1"), order.clone()).await.expect("runs");
    let steps = store.steps(&id("o-1")).await.expect("steps");
    let input = steps
        .iter()
        .find(|s| s.name == INPUT_STEP)
        .expect("input journaled");
    assert_eq!(
        input.state,
        idem::StepState::Done {
            result: bytes::Bytes::from(r#"{"id":1,"amount":5}"#)
        }
    );
    let other = Order { id: 1, amount: 6 };
    assert!(
        matches!(
            durable.run(&key("o-1"), other).await,
            Err(RunError::Mismatch)
        ),
        "the same key with another input is refused"
    );
    assert_eq!(world.runs.load(Ordering::SeqCst), 1);
}

fn fingerprint_of(order: &Order) -> Fingerprint {
    Fingerprint::of_bytes(&serde_json::to_vec(order).expect("encodes"))
}

#[tokio::test]
async fn a_record_with_no_journaled_input_is_released_for_its_next_delivery() {
    let (clock, store, idem) = setup();
    let world = Arc::new(World::default());
    let durable = orders(&idem, &world);
    let completer = Completer::new().register(&durable);
    // A worker claimed the key and died before journaling the input.
    let order = Order { id: 3, amount: 1 };
    let params =
        ClaimParams::new(LEASE, Duration::from_secs(3600)).fingerprint(fingerprint_of(&order));
    assert!(matches!(
        store.claim(&id("o-3"), &params).await,
        Ok(ClaimOutcome::Acquired(_))
    ));
    clock.advance(LEASE);

    let swept = completer.sweep().await;
    assert_eq!((swept.found, swept.released), (1, 1), "{swept:?}");
    assert_eq!(
        world.runs.load(Ordering::SeqCst),
        0,
        "nothing to run it with"
    );
    let record = store.get(&id("o-3")).await.expect("get").expect("present");
    assert!(matches!(record.state, State::Released { .. }), "{record:?}");
    assert_eq!(
        completer.sweep().await.found,
        0,
        "a released record is not abandoned"
    );

    let done = durable
        .run(&key("o-3"), order)
        .await
        .expect("the next delivery runs it");
    assert!(
        matches!(done, Outcome::Executed { attempt: 3, .. }),
        "{done:?}"
    );
    assert_eq!(world.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_input_of_another_shape_is_released_not_run() {
    let (clock, store, idem) = setup();
    let world = Arc::new(World::default());
    let durable = orders(&idem, &world);
    let completer = Completer::new().register(&durable);
    let params = ClaimParams::new(LEASE, Duration::from_secs(3600));
    let ClaimOutcome::Acquired(lease) = store.claim(&id("old"), &params).await.expect("claim")
    else {
        panic!("fresh key");
    };
    store.begin_step(&lease, INPUT_STEP).await.expect("begin");
    store
        .finish_step(
            &lease,
            INPUT_STEP,
            bytes::Bytes::from_static(b"\"an older version\""),
        )
        .await
        .expect("finish");
    clock.advance(LEASE);
    let swept = completer.sweep().await;
    assert_eq!((swept.found, swept.released), (1, 1), "{swept:?}");
    assert_eq!(world.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_completers_redrive_each_record_exactly_once_and_leave_live_leases_alone() {
    let (clock, store, idem) = setup();
    let world = Arc::new(World::default());
    let durable = orders(&idem, &world);
    for i in 0..24 {
        cut_off(
            &durable,
            &world,
            &format!("o-{i}"),
            Order { id: i, amount: 1 },
        )
        .await;
    }
    clock.advance(LEASE);
    // A run that is live right now: its lease has not run out.
    let live = Order { id: 99, amount: 1 };
    let params =
        ClaimParams::new(LEASE, Duration::from_secs(3600)).fingerprint(fingerprint_of(&live));
    let ClaimOutcome::Acquired(live_lease) =
        store.claim(&id("live"), &params).await.expect("claim")
    else {
        panic!("fresh key");
    };

    let completers: Vec<Arc<Completer>> = (0..4)
        .map(|_| Arc::new(Completer::new().register(&durable).batch(10).concurrency(3)))
        .collect();
    let mut total = Sweep::default();
    for _ in 0..4 {
        let mut sweeps = tokio::task::JoinSet::new();
        for c in &completers {
            let c = Arc::clone(c);
            sweeps.spawn(async move { c.sweep().await });
        }
        for s in sweeps.join_all().await {
            total += s;
        }
    }
    assert_eq!(
        total.completed, 24,
        "every abandoned record finished once: {total:?}"
    );
    assert_eq!(total.errors, 0, "{total:?}");
    assert_eq!(
        world.runs.load(Ordering::SeqCst),
        48,
        "each cut-off run re-driven exactly once; the live run untouched"
    );
    let mut charges = world.charges.lock().clone();
    charges.sort_unstable();
    assert_eq!(charges, (0..24).collect::<Vec<_>>(), "one charge per order");
    let record = store.get(&id("live")).await.expect("get").expect("present");
    assert!(
        matches!(record.state, State::InProgress { token, .. } if token == live_lease.token),
        "{record:?}"
    );
}

#[tokio::test]
async fn a_handler_that_keeps_dying_runs_out_of_attempts() {
    let (clock, store, idem) = setup();
    let world = Arc::new(World::default());
    let durable = orders(&idem, &world);
    let completer = Completer::new().register(&durable);
    cut_off(&durable, &world, "poison", Order { id: 5, amount: 1 }).await;
    world.panic_on_attempt.lock().extend([2, 3]);
    for attempt in 2..=3 {
        clock.advance(LEASE);
        let swept = completer.sweep().await;
        assert_eq!(
            (swept.found, swept.errors),
            (1, 1),
            "attempt {attempt} panics: {swept:?}"
        );
    }
    clock.advance(LEASE);
    let swept = completer.sweep().await;
    assert_eq!((swept.found, swept.failed), (1, 1), "{swept:?}");
    assert_eq!(
        world.runs.load(Ordering::SeqCst),
        3,
        "attempt 4 is over the limit and does not run"
    );
    let record = store
        .get(&id("poison"))
        .await
        .expect("get")
        .expect("present");
    let State::Failed { failure } = record.state else {
        panic!("not failed: {record:?}");
    };
    assert_eq!(failure.class, FailureClass::Terminal);
    assert!(
        failure.message.contains("attempts exhausted (4 of 3)"),
        "{failure:?}"
    );
    assert_eq!(
        *world.charges.lock(),
        vec![5],
        "charged once across four attempts"
    );
}

#[tokio::test]
async fn a_park_step_in_doubt_parks_the_redriven_record() {
    let (clock, store, idem) = setup();
    let cut = Arc::new(Notify::new());
    let durable = {
        let cut = Arc::clone(&cut);
        idem.durable(
            Scope::new("mail").expect("valid"),
            move |to: String, ctx: Context| {
                let cut = Arc::clone(&cut);
                async move {
                    ctx.step("send", Park, |_| async {
                        if ctx.attempt() == 1 {
                            cut.notify_one();
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, Io>(())
                    })
                    .await?;
                    Ok::<_, OrderError>(to)
                }
            },
        )
        .expect("journal")
    };
    let running = {
        let durable = durable.clone();
        tokio::spawn(async move { durable.run(&key("m-1"), "ann@example.com".into()).await })
    };
    cut.notified().await;
    running.abort();
    clock.advance(LEASE);
    let swept = Completer::new().register(&durable).sweep().await;
    assert_eq!((swept.found, swept.parked), (1, 1), "{swept:?}");
    let record = store
        .get(&RecordId::parse("mail", "m-1").expect("valid"))
        .await
        .expect("get")
        .expect("present");
    assert!(
        matches!(&record.state, State::Failed { failure } if failure.is_parked()),
        "{record:?}"
    );
}

#[tokio::test]
async fn bad_inputs_and_stores_without_a_journal_are_refused() {
    let (_clock, store, idem) = setup();
    let echo = idem
        .durable(
            Scope::new("echo").expect("valid"),
            |s: String, _ctx| async move { Ok::<_, Io>(s) },
        )
        .expect("journal");
    let big = "x".repeat(2000);
    let refused = echo
        .run(&key("big"), big)
        .await
        .expect_err("over 1024 bytes");
    assert!(
        matches!(&refused, RunError::Input { reason } if reason.contains("limit of 1024")),
        "{refused:?}"
    );
    let probe = RecordId::parse("echo", "big").expect("valid");
    assert!(
        store.get(&probe).await.expect("get").is_none(),
        "nothing was claimed"
    );

    let bare = Idempotency::builder(Double::new(MemoryStore::new(), NoJournal))
        .build()
        .expect("config");
    let refused = bare
        .durable(
            Scope::new("s").expect("valid"),
            |s: String, _ctx| async move { Ok::<_, Io>(s) },
        )
        .expect_err("no journal");
    assert_eq!(refused, ConfigError::NoStepJournal);
}

#[test]
fn step_names_cannot_take_the_reserved_prefix() {
    assert!(idem::step::check_step_name(INPUT_STEP).is_err());
    assert!(idem::step::check_step_name("$anything")
        .expect_err("reserved")
        .contains("reserved"));
    assert!(idem::step::check_step_name("a$b").is_ok());
}
