//! The fault-injection run for broker adapters (docs/design.md §12): worker
//! processes consume a published workload with duplicates and poison
//! messages from a real broker, with their records in a real store, while
//! faults are injected at seeded random points:
//!
//! - a worker SIGKILLed (and replaced), mid-handler or anywhere else;
//! - a worker SIGSTOPped for 1.5 to 3 leases, then SIGCONTed: a stale
//!   holder that wakes up mid-handler;
//! - a worker told to leave cleanly (it finishes what it holds; a Kafka
//!   member commits and leaves its group) while a new one joins;
//! - the broker killed and started again (it keeps what it stored);
//! - the store killed and started again (a Redis of the run's own, with
//!   an fsync-always append-only file; a store on the broker's own
//!   server, as SQS's DynamoDB on moto, is not restarted, nor is a broker
//!   that keeps nothing across a restart);
//! - the connection to the broker, or to the store, reset, delayed or
//!   blackholed for a while, through a [`FaultProxy`](crate::doubles::proxy::FaultProxy) in front of each.
//!
//! The handler is [`fenced_handler`](crate::consumers::ledger::fenced_handler): a
//! handler can run again after a crash or a takeover, so its effect is a
//! fenced write. After the fault phase the run heals everything, waits
//! until every message is settled, and [judges](judge) the ledger,
//! the downstream, the store's records and the dead-letters: every good
//! message completed by the holder whose write the downstream holds, no
//! completed key claimed again, none lost, and dead-letters for the poison
//! messages only.
//!
//! An adapter's tests run it with [`run`] over their [`ChaosBroker`](crate::consumers::under_test::ChaosBroker);
//! `scripts/chaos-consumers` runs the long version ([`ChaosPlan::from_env`]).
//!
//! [`faults`] is the seeded schedule every fault-injection run shares
//! (this one, and the `idem-chaos` binary's store and HTTP runs).

#[cfg(feature = "consumers")]
mod consumers;
pub mod faults;
#[cfg(feature = "consumers")]
mod judge;

#[cfg(feature = "consumers")]
pub use consumers::*;
