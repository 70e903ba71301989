//! The consumer fault-injection run (`idem_testkit::chaos`) on Kafka
//! (Tansu): worker processes of this binary are static members of one
//! group (two in a pipeline run), one member name per worker slot,
//! consuming through fault proxies in front of the broker (which
//! advertises the proxy's port) and a Redis of the run's own, while
//! members are killed (their replacements take their name and
//! partitions, and are redelivered what the killed one had not
//! committed), stopped, and stopped cleanly, the store is restarted and
//! both links are cut, delayed and blackholed (Tansu is not restarted:
//! its in-memory storage keeps nothing). `IDEM_CHAOS_SECS` makes it a
//! long run.
mod common;

idem_testkit::consumer_chaos!(common::Setup, "kafka");
