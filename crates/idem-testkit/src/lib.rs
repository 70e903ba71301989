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
//! [`ManualClock`](idem::ManualClock) they were built with, and nothing sleeps.
//!
//! The kit is in folders by what they prove with:
//!
//! - [`conformance`]: the store contract's cases, in groups by capability;
//! - [`servers`]: the real services, started for a run on loopback;
//! - [`doubles`]: store doubles and the TCP fault proxy;
//! - `consumers` (the `consumers` feature): the consumer adapters'
//!   shared proof, each over the adapter's `BrokerUnderTest`;
//! - [`chaos`]: the one fault-injection engine (faults, seeded schedule,
//!   report) every run drives its target with, and (with `consumers`)
//!   the broker adapters' target, one `consumer_chaos!` line per adapter;
//! - [`bench`](mod@bench): the throughput benches;
//! - [`blobs`]: what every blob store must do;
//! - [`logs`]: a log subscriber's output kept for a test to read.

pub mod at_rest;
pub mod bench;
pub mod blobs;
pub mod chaos;
pub mod conformance;
#[cfg(feature = "consumers")]
pub mod consumers;
pub mod doubles;
pub mod fixtures;
pub mod logs;
pub mod rerun;
pub mod servers;

pub use conformance::{ConformanceStore, Fixture, TimeControl};
pub use doubles::{DownStore, TokioClock};
pub use servers::{free_port, ServerError};
