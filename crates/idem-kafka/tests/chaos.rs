//! The consumer fault-injection run (`idem_testkit::chaos`) on Kafka
//! (Tansu): worker processes of this binary are members of one group,
//! consuming through fault proxies in front of the broker (which
//! advertises the proxy's port) and a Redis of the run's own, while
//! members are killed (leaving the group; their replacements join) and
//! stopped past their session, the store is restarted and both links are
//! cut, delayed and blackholed (Tansu is not restarted: its in-memory
//! storage keeps nothing). `IDEM_CHAOS_SECS` makes it a long run.

mod common;

idem_testkit::consumer_chaos!(common::Setup, "kafka");
