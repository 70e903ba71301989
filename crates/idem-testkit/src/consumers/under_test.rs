//! What the shared consumer scenarios need of a broker: an adapter's
//! tests implement [`BrokerUnderTest`] once, and every scenario (the
//! worker kill in [`scenario`](crate::consumers::scenario)) runs against it.

use std::future::Future;

use idem::GetRecord;

use crate::consumers::ledger::{Ledger, Work};
use crate::ServerError;

/// A dead-letter as the scenarios read it back from the broker.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeadLetterSeen {
    /// The `Idem-Key` header, when the message had a key.
    pub key: Option<String>,
    /// The `Idem-Reason` header.
    pub reason: String,
    /// The `Idem-Consumer` header.
    pub consumer: Option<String>,
}

/// One broker, set up for one test: a fresh destination (queue, stream),
/// its effects ledger, and a consumer of it with the scenario's executor
/// ([`scenario::executor`](crate::consumers::scenario::executor)), scope `orders` and
/// keys from the `Idempotency-Key` header.
///
/// Worker processes are the test binary started again; they find the
/// setup in their environment ([`env`](Self::env) there,
/// [`from_env`](Self::from_env) here).
pub trait BrokerUnderTest: Sized {
    /// A fresh destination named after `name`, and whatever must exist
    /// before the first publish (a durable consumer, a topology).
    fn create(name: &str) -> impl Future<Output = Self>;

    /// In a worker process: the setup its parent passed, or `None` when
    /// the binary runs as a plain test.
    fn from_env() -> Option<Self>;

    /// The environment that passes this setup to a worker process.
    fn env(&self) -> Vec<(&'static str, String)>;

    /// The effects ledger its handlers write.
    fn ledger(&self) -> &Ledger;

    /// Publishes `payload`, with the `Idempotency-Key` header when `key`
    /// is given, and waits until the broker has stored it.
    fn publish(&self, key: Option<&str>, payload: &str) -> impl Future<Output = ()> + Send;

    /// Consumes with the handler of `work` (by
    /// [`Work::handler`](crate::consumers::ledger::Work::handler)) until `shutdown`
    /// resolves, then stops as the adapter's `run` does on shutdown
    /// (finishing the deliveries in flight; a Kafka member commits and
    /// leaves its group), or until the process is killed.
    fn consume(
        &self,
        work: Work,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()>;

    /// Waits (a bounded time) until the broker holds nothing unsettled and
    /// at least `dead_letters` dead-letters are in (for brokers that
    /// cannot see unacknowledged deliveries); false if that did not
    /// happen.
    fn settled(&self, dead_letters: usize) -> impl Future<Output = bool>;

    /// The dead-letters, read back from the broker.
    fn dead_letters(&self) -> impl Future<Output = Vec<DeadLetterSeen>>;
}

/// What the fault-injection runs ([`chaos`](crate::chaos)) need of a
/// broker beyond [`BrokerUnderTest`]: a broker server of the run's own,
/// which it restarts, and the same destination reached at other ports
/// (the fault proxies in front of the broker and the store).
pub trait ChaosBroker: BrokerUnderTest + Clone + Send + Sync + 'static {
    /// A broker server the run owns.
    type Server: Send + 'static;

    /// The store the consumers write, read back by the checker.
    type Store: GetRecord + Send + Sync;

    /// Starts a broker server that keeps what it was sent across a
    /// restart.
    fn start_server() -> Result<Self::Server, ServerError>;

    /// The loopback port `server` listens on.
    fn port(server: &Self::Server) -> u16;

    /// The loopback port the broker tells its clients to connect to, when
    /// that is not the one they first reach (Kafka's advertised
    /// listener): the run's fault proxy then listens there. `None`, the
    /// default, for brokers whose clients stay on the address given.
    fn advertised_port(_server: &Self::Server) -> Option<u16> {
        None
    }

    /// Whether a restart keeps what the broker stored; the run restarts
    /// only brokers that do (moto keeps everything in memory).
    const RESTARTS: bool = true;

    /// The loopback port of the store when it lives on the broker's own
    /// server (SQS with DynamoDB, both on moto); `None`, the default, for
    /// a Redis of the run's own.
    fn store_port(_server: &Self::Server) -> Option<u16> {
        None
    }

    /// The URL of the store listening on loopback `port`.
    fn store_url(port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }

    /// Stops `server` (as the server's own restart does: SIGKILL for
    /// nats-server, a clean stop for RabbitMQ) and starts it again on the
    /// same port with what it stored.
    fn restart(server: &mut Self::Server) -> Result<(), ServerError>;

    /// A fresh destination named after `name` on the broker at loopback
    /// `broker_port`, with its records in the store at `store_url`.
    fn create_at(name: &str, broker_port: u16, store_url: &str) -> impl Future<Output = Self>;

    /// The same destination, its broker reached at `broker_port` and its
    /// store at `store_url`.
    fn through(&self, broker_port: u16, store_url: &str) -> Self;

    /// A connection to the store.
    fn store(&self) -> impl Future<Output = Self::Store>;

    /// The second hop of a pipeline run from this destination: a
    /// destination of its own on the same broker, with its own records
    /// (a namespace or table of its own in the same store) and its
    /// ledger at [`Ledger::output`]. Derived from this setup alone, so a
    /// worker process finds the same one ([`through`](Self::through)
    /// commutes with it); [`declare`](Self::declare) makes it exist.
    fn output(&self) -> Self;

    /// Creates what this destination needs before the first message is
    /// sent to it (idempotent: a stream, a queue, a topic, a table, a
    /// durable consumer).
    fn declare(&self) -> impl Future<Output = ()>;

    /// What a [`Message`](idem::outbox::Message) sent to this
    /// destination is addressed to (a subject, a queue, a topic, a queue
    /// URL).
    fn address(&self) -> String;

    /// The adapter's [`Sender`](idem::outbox::Sender), reaching the broker
    /// as this setup does.
    fn sender(&self) -> impl Future<Output = std::sync::Arc<dyn idem::outbox::Sender>> + Send;
}
