//! The consumer fault-injection run (`idem_testkit::chaos`) on SQS (moto,
//! with the store on DynamoDB in the same moto): worker processes of this
//! binary consume through fault proxies in front of moto's SQS and
//! DynamoDB endpoints, while workers are killed and stopped and both links
//! are cut, delayed and blackholed (moto is not restarted: it keeps
//! nothing). `IDEM_CHAOS_SECS` makes it a long run.

mod common;

idem_testkit::consumer_chaos!(common::Setup, "sqs");
