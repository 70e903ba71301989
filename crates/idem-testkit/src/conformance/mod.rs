//! The conformance suite every idem store must pass (the store contract in
//! `idem::contract`), in groups by capability: [`core`] and
//! [`concurrency`] for every store, [`batches`], [`admin`] and [`steps`]
//! for the stores that have them, [`ttl`] for stores that tell a record's
//! time left, [`horizon`] for stores that remember expired keys (with a
//! fixture whose store remembers). Each case takes a [`Fixture`] and panics with a message
//! saying which rule of the contract the store broke.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{
    ClaimMany, CompleteMany, DeleteRecord, Failure, FailureClass, FindAbandoned, GetRecord, Key,
    ListRecords, ManualClock, PurgeExpired, RecordId, RecordTtl, Scope, StepJournal, StepState,
    Store, StoreError,
};

pub mod admin;
pub mod batches;
pub mod concurrency;
pub mod core;
pub mod horizon;
mod layouts;
pub mod outbox;
pub mod outbox_table;
pub mod pending;
pub mod steps;
pub mod ttl;

/// What the [`core`] and [`concurrency`] cases need: the primitives, and
/// reading a record back.
pub trait Core: Store + GetRecord {}
impl<S: Store + GetRecord> Core for S {}

/// What the [`batches`] cases need.
pub trait Batches: Core + ClaimMany + CompleteMany {}
impl<S: Core + ClaimMany + CompleteMany> Batches for S {}

/// What the [`admin`] cases need.
pub trait Admin: Core + DeleteRecord + ListRecords + PurgeExpired + FindAbandoned {}
impl<S: Core + DeleteRecord + ListRecords + PurgeExpired + FindAbandoned> Admin for S {}

/// What the [`steps`] cases need (a deleted record's journal goes with
/// it).
pub trait Steps: Core + StepJournal + DeleteRecord {}
impl<S: Core + StepJournal + DeleteRecord> Steps for S {}

/// What the [`ttl`] case needs.
pub trait Ttl: Core + RecordTtl + DeleteRecord {}
impl<S: Core + RecordTtl + DeleteRecord> Ttl for S {}

/// Everything the whole suite needs: all primitives and capabilities.
pub trait ConformanceStore: Batches + Admin + Steps {}
impl<S: Batches + Admin + Steps> ConformanceStore for S {}

/// How the suite moves time.
#[derive(Debug, Clone)]
pub enum TimeControl {
    /// The store reads this clock; advancing it is instant.
    Manual(ManualClock),
    /// The store decides time itself; advancing means sleeping.
    Real,
}

/// A store under test, with how to move its time and a unique scope prefix.
#[derive(Debug)]
pub struct Fixture<S> {
    /// The store.
    pub store: Arc<S>,
    /// How time moves.
    pub time: TimeControl,
    /// The short lease used by expiry cases.
    pub lease: Duration,
    /// Whether this store serves only this case, so exact counts (of
    /// purged records, for example) can be asserted.
    pub exclusive: bool,
    prefix: String,
}

impl<S: Store> Fixture<S> {
    /// A store that reads `clock`: leases of 10 s, moved instantly. The
    /// store should be new for this case (exact counts are asserted).
    pub fn manual(store: S, clock: ManualClock, case: &str) -> Self {
        Self {
            store: Arc::new(store),
            time: TimeControl::Manual(clock),
            lease: Duration::from_secs(10),
            exclusive: true,
            prefix: unique_prefix(case),
        }
    }

    /// A store that decides time on its server: leases of 600 ms, moved by
    /// sleeping. The store may be shared with other cases.
    pub fn real_time(store: S, case: &str) -> Self {
        Self {
            store: Arc::new(store),
            time: TimeControl::Real,
            lease: Duration::from_millis(600),
            exclusive: false,
            prefix: unique_prefix(case),
        }
    }

    /// Uses a different short lease (slow servers may need more).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Moves time past `d` from now: exactly `d` on a manual clock, `d`
    /// plus a margin for server-side clocks.
    pub async fn advance(&self, d: Duration) {
        match &self.time {
            TimeControl::Manual(clock) => clock.advance(d),
            TimeControl::Real => tokio::time::sleep(d + Duration::from_millis(60)).await,
        }
    }

    /// Whether time is manual (cases that need many expiries loop more).
    pub fn is_manual(&self) -> bool {
        matches!(self.time, TimeControl::Manual(_))
    }

    /// A scope unique to this case and run.
    pub fn scope(&self, name: &str) -> Scope {
        Scope::new(&format!("{}/{name}", self.prefix)).expect("test scopes are valid")
    }
}

fn unique_prefix(case: &str) -> String {
    format!("idem-test/{case}/{:016x}", rand::random::<u64>())
}

/// Generates one `#[tokio::test]` per conformance case. The first
/// argument is an `async fn(&'static str) -> Fixture<S>` called with each
/// case's name; then the groups to run (default: `core, concurrency,
/// batches, admin, steps, outbox`), so a store without a capability still runs the
/// rest:
///
/// ```ignore
/// idem_testkit::conformance_suite!(fixture);
/// idem_testkit::conformance_suite!(fixture; core, concurrency, steps);
/// idem_testkit::conformance_suite!(fixture; ttl);
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:path) => {
        $crate::conformance_suite!($fixture; core, concurrency, batches, admin, steps, outbox);
    };
    ($fixture:path; $($group:ident),+ $(,)?) => {
        $( $crate::__conformance_group!($fixture; $group); )+
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_group {
    ($fixture:path; core) => {
        $crate::__conformance_cases!(
            $fixture; core;
            claim_complete_replay,
            mismatch_is_refused_in_every_live_state,
            live_lease_reports_retry_after,
            expired_lease_is_taken_over,
            stale_token_is_rejected_by_every_write,
            finished_records_reject_every_write,
            expiry_is_honoured_at_read_time,
            peek_reads_without_claiming,
            released_record_is_reclaimed,
            failures_are_classified,
            extend_keeps_the_lease,
            stored_bytes_round_trip,
            calls_yield_to_the_runtime,
            earlier_response_layouts_replay,
            sealed_responses_show_nothing,
        );
    };
    ($fixture:path; concurrency) => {
        $crate::__conformance_cases!(
            $fixture; concurrency;
            concurrent_claimers_on_one_key,
            concurrent_claimers_on_expired_and_released_records,
            concurrent_claimers_on_many_keys,
        );
    };
    ($fixture:path; batches) => {
        $crate::__conformance_cases!(
            $fixture; batches;
            batch_claims,
            batch_claims_follow_every_claim_rule,
            concurrent_batches_on_overlapping_keys,
            batch_completes,
            batch_completes_race_single_writes,
        );
    };
    ($fixture:path; admin) => {
        $crate::__conformance_cases!(
            $fixture; admin;
            the_longest_durations_are_held,
            tokens_are_never_reused,
            purge_removes_only_expired,
            delete_force_releases,
            list_by_state_and_scope,
            abandoned_records_are_found,
            expired_records_are_not_listed,
        );
    };
    ($fixture:path; steps) => {
        $crate::__conformance_cases!(
            $fixture; steps;
            capabilities_reach_the_executor,
            steps_are_journaled_and_replayed,
            steps_are_fenced_by_the_lease,
            a_new_record_starts_with_an_empty_journal,
            parked_records_are_resolved,
            journals_are_per_record_under_concurrency,
            step_layouts_replay_and_sealed_steps_show_nothing,
        );
    };
    ($fixture:path; outbox) => {
        $crate::__conformance_cases!(
            $fixture; outbox;
            messages_are_stored_with_the_completion,
            a_replay_redispatches_what_was_never_confirmed,
            concurrent_dispatchers_send_each_run_once,
            a_sent_run_leaves_nothing_pending_and_its_key_reused_sends_anew,
        );
    };
    ($fixture:path; pending) => {
        $crate::__conformance_cases!(
            $fixture; pending;
            the_index_reaches_the_executor,
            a_mark_is_held_then_taken_once_and_cleared_by_its_fence,
            only_a_held_completion_marks_and_marks_stay_in_their_scope,
            a_mark_ends_with_its_record,
            concurrent_takers_take_each_run_once,
        );
    };
    ($fixture:path; horizon) => {
        $crate::__conformance_cases!(
            $fixture; horizon;
            a_late_retry_is_forgotten_before_and_after_the_purge,
            failed_keys_are_remembered_and_released_ones_are_not,
            concurrent_late_retries_never_run,
            the_outboxs_own_records_are_never_remembered,
        );
    };
    ($fixture:path; horizon_days) => {
        $crate::__conformance_cases!(
            $fixture; horizon;
            the_memory_ends_whole_days_after_it,
        );
    };
    ($fixture:path; ttl) => {
        $crate::__conformance_cases!(
            $fixture; ttl;
            record_ttl_follows_the_response,
        );
    };
    ($fixture:path; $other:ident) => {
        ::core::compile_error!(::core::concat!(
            "unknown conformance group `",
            ::core::stringify!($other),
            "` (core, concurrency, batches, admin, steps, outbox, pending, ttl, horizon, horizon_days)"
        ));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($fixture:path; $group:ident; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let fixture = $fixture(::core::stringify!($case)).await;
                $crate::conformance::$group::$case(&fixture).await;
            }
        )*
    };
}

const LONG: Duration = Duration::from_secs(3600);

fn id(scope: &Scope, key: &str) -> RecordId {
    RecordId::new(scope.clone(), Key::new(key).expect("test keys are valid"))
}

fn params<S>(f: &Fixture<S>) -> ClaimParams {
    ClaimParams::new(f.lease, LONG)
}

async fn acquire<S: Store>(f: &Fixture<S>, id: &RecordId, p: &ClaimParams) -> Lease {
    match f.store.claim(id, p).await.expect("claim succeeds") {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("expected {id} to be acquired, got {other:?}"),
    }
}

async fn claim<S: Store>(f: &Fixture<S>, id: &RecordId, p: &ClaimParams) -> ClaimOutcome {
    f.store.claim(id, p).await.expect("claim succeeds")
}

fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost)),
        "{what} with a stale token must be LeaseLost, got {result:?}"
    );
}

/// Every write with `lease` (complete, terminal and retryable fail, extend,
/// release) must be refused as `LeaseLost`.
async fn assert_every_write_rejected<S: Store>(f: &Fixture<S>, lease: &Lease) {
    let late = Bytes::from_static(b"late");
    assert_lease_lost(f.store.complete(lease, late, LONG).await, "complete");
    for class in [FailureClass::Terminal, FailureClass::Retryable] {
        let failure = Failure::new(class, "late");
        assert_lease_lost(f.store.fail(lease, failure, LONG).await, "fail");
    }
    assert_lease_lost(f.store.extend(lease, LONG).await, "extend");
    assert_lease_lost(f.store.release(lease).await, "release");
}

/// Awaits `fut`, telling `polled` after each poll whether it was pending.
async fn counting<F: std::future::Future>(fut: F, polled: &mut impl FnMut(bool)) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let poll = fut.as_mut().poll(cx);
        polled(poll.is_pending());
        poll
    })
    .await
}

fn done(result: &[u8]) -> StepState {
    StepState::Done {
        result: Bytes::copy_from_slice(result),
    }
}

/// Leaves a record in each state under `scope` (keys named after the
/// states), with retentions and leases of `f.lease`, each read back.
async fn records_in_every_state<S: Core>(f: &Fixture<S>, scope: &Scope, p: &ClaimParams) {
    for state in ["completed", "failed", "released", "in-progress"] {
        let id = id(scope, state);
        let lease = acquire(f, &id, p).await;
        match state {
            "completed" => {
                f.store
                    .complete(&lease, Bytes::from_static(b"old"), f.lease)
                    .await
            }
            "failed" => {
                f.store
                    .fail(&lease, Failure::new(FailureClass::Terminal, "old"), f.lease)
                    .await
            }
            "released" => f.store.release(&lease).await,
            _ => Ok(()),
        }
        .expect("holder writes");
        assert!(f.store.get(&id).await.expect("get").is_some());
    }
}
