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
//! With the `consumers` feature it also holds the consumer adapters'
//! shared proof: the worker-kill `scenario`, the connection `cuts`, the
//! fault-injection run (`chaos`, one `consumer_chaos!` line per adapter)
//! and the throughput bench (`bench::consumers`), each over the adapter's
//! `under_test::BrokerUnderTest`.

pub mod bench;
#[cfg(feature = "consumers")]
pub mod chaos;
mod clock;
mod cluster;
pub mod conformance;
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
pub use conformance::{ConformanceStore, Fixture, TimeControl};
pub use down::DownStore;
pub use server::{free_port, ServerError};
