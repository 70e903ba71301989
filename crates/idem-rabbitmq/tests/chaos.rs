//! The consumer fault-injection run (`idem_testkit::chaos`) on RabbitMQ:
//! worker processes of this binary consume through fault proxies in front
//! of a broker and a Redis of the run's own, while workers are killed and
//! stopped, both servers restarted and both connections cut, delayed and
//! blackholed. `IDEM_CHAOS_SECS` makes it a long run.

mod common;

idem_testkit::consumer_chaos!(common::Setup, "rabbitmq");
