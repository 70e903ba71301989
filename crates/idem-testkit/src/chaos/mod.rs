//! Fault injection: [`faults`], the seeded schedule every run shares (the
//! `idem-chaos` binary's store and HTTP runs, and the broker adapters'),
//! and with the `consumers` feature `consumers`, the broker adapters'
//! fault-injection run (its items are also here, at `chaos::`).

#[cfg(feature = "consumers")]
pub mod consumers;
pub mod faults;
#[cfg(feature = "consumers")]
mod judge;

#[cfg(feature = "consumers")]
pub use consumers::*;
