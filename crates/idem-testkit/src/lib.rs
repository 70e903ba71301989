//! The conformance suite every idem store must pass (the store contract in
//! `idem::contract`).
//!
//! A store crate adds one line to a test file, naming an `async fn` that
//! builds a [`Fixture`] for a case (here `MemoryStore`'s own, from
//! `crates/idem/tests/memory_conformance.rs`; a server store would use
//! [`Fixture::real_time`] with a connected store):
//!
//! ```
//! use idem::{ManualClock, MemoryStore};
//! use idem_testkit::Fixture;
//!
//! async fn fixture(case: &'static str) -> Fixture<MemoryStore<ManualClock>> {
//!     let clock = ManualClock::default();
//!     let store = MemoryStore::builder().clock(clock.clone()).build();
//!     Fixture::manual(store, clock, case)
//! }
//!
//! idem_testkit::conformance_suite!(fixture);
//! # fn main() {}
//! ```
//!
//! Each case becomes its own `#[tokio::test]` (multi-threaded), so the test
//! crate needs `tokio` with the `macros` and `rt-multi-thread` features.
//! Cases isolate themselves by unique scopes, so they can run in parallel
//! against one shared server.
//!
//! Stores that decide time themselves (Redis `TIME`, PostgreSQL `now()`)
//! use [`Fixture::real_time`]: expiry cases then sleep past short real
//! leases. Local stores use [`Fixture::manual`] with the
//! [`ManualClock`] they were built with, and nothing sleeps.
//!
//! With the `consumers` feature it also holds the consumer adapters'
//! shared proof: the worker-kill `scenario`, the connection `cuts`, the
//! fault-injection run (`chaos`, one `consumer_chaos!` line per adapter)
//! and the throughput bench (`bench::consumers`), each over the adapter's
//! `under_test::BrokerUnderTest`.

use std::sync::Arc;
use std::time::Duration;

use idem::{
    ClaimMany, CompleteMany, DeleteRecord, FindAbandoned, GetRecord, ListRecords, ManualClock,
    PurgeExpired, Scope, StepJournal, Store,
};

pub mod bench;
pub mod cases;
#[cfg(feature = "consumers")]
pub mod chaos;
mod clock;
mod cluster;
#[cfg(feature = "consumers")]
pub mod cuts;
pub mod double;
mod down;
pub mod faults;
pub mod kafka;
#[cfg(feature = "consumers")]
pub mod ledger;
pub mod moto;
pub mod nats;
pub mod postgres;
pub mod proxy;
pub mod rabbitmq;
pub mod redis;
#[cfg(feature = "consumers")]
pub mod scenario;
mod server;
#[cfg(feature = "consumers")]
pub mod till;
pub mod tls;
#[cfg(feature = "consumers")]
pub mod under_test;

pub use clock::TokioClock;
pub use down::DownStore;
pub use server::{free_port, ServerError};

/// Everything the suite needs: all primitives and capabilities.
pub trait ConformanceStore:
    Store
    + GetRecord
    + DeleteRecord
    + ListRecords
    + PurgeExpired
    + ClaimMany
    + CompleteMany
    + StepJournal
    + FindAbandoned
{
}

impl<S> ConformanceStore for S where
    S: Store
        + GetRecord
        + DeleteRecord
        + ListRecords
        + PurgeExpired
        + ClaimMany
        + CompleteMany
        + StepJournal
        + FindAbandoned
{
}

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

impl<S: ConformanceStore> Fixture<S> {
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

/// Generates one `#[tokio::test]` per conformance case. The argument is an
/// `async fn(&'static str) -> Fixture<S>` called with each case's name.
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:path) => {
        $crate::__conformance_cases!(
            $fixture;
            claim_complete_replay,
            the_longest_durations_are_held,
            mismatch_is_refused_in_every_live_state,
            live_lease_reports_retry_after,
            expired_lease_is_taken_over,
            stale_token_is_rejected_by_every_write,
            finished_records_reject_every_write,
            tokens_are_never_reused,
            expiry_is_honoured_at_read_time,
            peek_reads_without_claiming,
            released_record_is_reclaimed,
            failures_are_classified,
            extend_keeps_the_lease,
            concurrent_claimers_on_one_key,
            concurrent_claimers_on_expired_and_released_records,
            concurrent_claimers_on_many_keys,
            batch_claims,
            batch_claims_follow_every_claim_rule,
            concurrent_batches_on_overlapping_keys,
            batch_completes,
            batch_completes_race_single_writes,
            purge_removes_only_expired,
            delete_force_releases,
            list_by_state_and_scope,
            stored_bytes_round_trip,
            calls_yield_to_the_runtime,
            capabilities_reach_the_executor,
            steps_are_journaled_and_replayed,
            steps_are_fenced_by_the_lease,
            a_new_record_starts_with_an_empty_journal,
            parked_records_are_resolved,
            journals_are_per_record_under_concurrency,
            abandoned_records_are_found,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($fixture:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let fixture = $fixture(stringify!($case)).await;
                $crate::cases::$case(&fixture).await;
            }
        )*
    };
}
