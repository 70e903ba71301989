//! The consumer adapters' shared proof (the `consumers` feature), each over
//! the adapter's [`under_test::BrokerUnderTest`]: the worker-kill
//! [`scenario`], the connection [`cuts`], the [`ledger`] that records what
//! handlers did, and [`till`] for waiting on it.

pub mod cuts;
pub mod ledger;
pub mod scenario;
pub mod till;
pub mod under_test;
