//! The consumer fault-injection run of `tests/chaos.rs` with the topology
//! declared as quorum queues (`x-queue-type: quorum`, RabbitMQ 4's
//! default type): the same faults, the same judge.

mod common;

idem_testkit::consumer_chaos!(common::Quorum, "rabbitmq-quorum");
