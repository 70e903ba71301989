//! Fault injection: one [`engine`] for every fault-injection run, with
//! one vocabulary of faults ([`Fault`]), one seeded [`schedule`] and one
//! [`Report`]. A run's [`Target`] brings its processes, its workload and
//! its checker: the `idem-chaos` binary's workers against a store and its
//! HTTP gateway run, and (with the `consumers` feature) the broker
//! adapters' consumers (`consumers`, whose items are also here, at
//! `chaos::`).

#[cfg(feature = "consumers")]
pub mod consumers;
pub mod engine;
mod fault;
mod net;
mod report;
pub mod schedule;

#[cfg(feature = "consumers")]
pub use consumers::*;
pub use engine::{run, Clock, FaultPlan, Injected, Progress, Target};
pub use fault::{Fault, Link};
pub use report::{Findings, Report, Violation};
