//! What a broker adapter hands the consumer layer.

use std::collections::BTreeMap;
use std::future::Future;

use bytes::Bytes;

/// A delivery, as the consumer layer sees it. Broker adapters implement
/// this over their own message types.
pub trait Message: Send + Sync + 'static {
    /// The payload.
    fn payload(&self) -> &[u8];

    /// A header's value, when present and text. Names are matched as the
    /// broker matches them.
    fn header(&self, name: &str) -> Option<&str>;

    /// The broker's own message id, if it has one.
    fn message_id(&self) -> Option<&str> {
        None
    }

    /// What [`message_id`](Self::message_id) is called, when the broker
    /// assigns it at each send (SQS's `MessageId`, a Kafka record's
    /// position): a key read from it catches the broker's redeliveries,
    /// but not a producer that sends the same message twice, whose second
    /// send gets an id of its own. `None` (the default) for ids the
    /// producer sets, as AMQP's `message-id` and JetStream's
    /// `Nats-Msg-Id`.
    fn message_id_per_send(&self) -> Option<&'static str> {
        None
    }

    /// How many times the broker has delivered this message, counting this
    /// delivery (1 for the first), when the broker says.
    fn delivery_count(&self) -> Option<u32> {
        None
    }

    /// The number of the last delivery the broker makes of this message,
    /// as [`delivery_count`](Self::delivery_count) counts them, when the
    /// broker moves a message aside on its own after so many (a RabbitMQ
    /// quorum queue's `x-delivery-limit`, plus one). The consumer
    /// dead-letters that delivery with the reason instead of running it:
    /// run and returned once more (a worker that died, a connection lost
    /// before the ack), it would be moved aside without one. `None` (the
    /// default) when the broker has no such limit.
    fn last_delivery(&self) -> Option<u32> {
        None
    }

    /// Tells the broker that the work on this delivery is still going, so
    /// it does not redeliver it (JetStream in-progress ack, SQS visibility
    /// extension). Called after each heartbeat the store confirmed; the
    /// default does nothing, for brokers that wait for the ack however
    /// long it takes.
    fn keep_alive(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A message held in memory: for tests of handlers, and for brokers
/// without an adapter of their own.
///
/// ```
/// use idem_consumer::{Message, OwnedMessage};
///
/// let m = OwnedMessage::new(r#"{"order": 7}"#).with_header("Idempotency-Key", "o-7");
/// assert_eq!(m.header("Idempotency-Key"), Some("o-7"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedMessage {
    payload: Bytes,
    headers: BTreeMap<String, String>,
    message_id: Option<String>,
    per_send: Option<&'static str>,
    delivery_count: Option<u32>,
    last_delivery: Option<u32>,
}

impl OwnedMessage {
    /// A message with this payload and nothing else.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self {
            payload: payload.into(),
            ..Self::default()
        }
    }

    /// Adds a header.
    #[must_use]
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.insert(name.to_owned(), value.to_owned());
        self
    }

    /// Sets the broker message id.
    #[must_use]
    pub fn with_message_id(mut self, id: &str) -> Self {
        self.message_id = Some(id.to_owned());
        self
    }

    /// Says that the message id was assigned by the broker at this send,
    /// and what it is called there (see [`Message::message_id_per_send`]).
    #[must_use]
    pub fn with_message_id_per_send(mut self, called: &'static str) -> Self {
        self.per_send = Some(called);
        self
    }

    /// Sets the delivery count.
    #[must_use]
    pub fn with_delivery_count(mut self, count: u32) -> Self {
        self.delivery_count = Some(count);
        self
    }

    /// Sets the number of the broker's last delivery of the message
    /// (see [`Message::last_delivery`]).
    #[must_use]
    pub fn with_last_delivery(mut self, last: u32) -> Self {
        self.last_delivery = Some(last);
        self
    }
}

impl Message for OwnedMessage {
    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    fn message_id_per_send(&self) -> Option<&'static str> {
        self.per_send
    }

    fn delivery_count(&self) -> Option<u32> {
        self.delivery_count
    }

    fn last_delivery(&self) -> Option<u32> {
        self.last_delivery
    }
}
