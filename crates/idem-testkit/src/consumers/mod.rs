//! The consumer adapters' shared proof (the `consumers` feature), each over
//! the adapter's [`under_test::BrokerUnderTest`]: the worker-kill
//! [`scenario`], the connection [`cuts`], the outbox [`pipeline`], the
//! [`ledger`] that records what handlers did, and [`till`] for waiting on
//! it.

pub mod cuts;
pub mod ledger;
pub mod pipeline;
pub mod scenario;
pub mod till;
pub mod under_test;
