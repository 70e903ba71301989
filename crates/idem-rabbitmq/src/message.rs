//! A delivery as the consumer sees it.

use idem_consumer::Message;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, ShortString};
use lapin::{Acker, BasicProperties};

/// Header counting how many times a message went through a retry queue.
pub const RETRIES_HEADER: &str = "x-idem-retries";

/// One delivery from RabbitMQ.
#[derive(Debug)]
pub struct AmqpMessage {
    pub(crate) data: Vec<u8>,
    pub(crate) properties: BasicProperties,
    exchange: String,
    routing_key: String,
    redelivered: bool,
    last_delivery: Option<u32>,
    pub(crate) acker: Acker,
}

impl AmqpMessage {
    /// The message of `delivery`, from a queue whose last delivery of a
    /// message is `last_delivery` when it has a delivery limit.
    pub(crate) fn new(delivery: Delivery, last_delivery: Option<u32>) -> Self {
        Self {
            last_delivery,
            data: delivery.data,
            properties: delivery.properties,
            exchange: delivery.exchange.to_string(),
            routing_key: delivery.routing_key.to_string(),
            redelivered: delivery.redelivered,
            acker: delivery.acker,
        }
    }

    /// The AMQP properties, headers included.
    pub fn properties(&self) -> &BasicProperties {
        &self.properties
    }

    /// The exchange it was published to (empty for the default exchange).
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// Its routing key.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// Whether the broker delivered it before (to this or another
    /// consumer) without an acknowledgement.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }

    pub(crate) fn header_value(&self, name: &str) -> Option<&AMQPValue> {
        self.properties.headers().as_ref()?.inner().get(name)
    }
}

impl Message for AmqpMessage {
    fn payload(&self) -> &[u8] {
        &self.data
    }

    fn header(&self, name: &str) -> Option<&str> {
        match self.header_value(name)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn message_id(&self) -> Option<&str> {
        self.properties
            .message_id()
            .as_ref()
            .map(ShortString::as_str)
    }

    fn last_delivery(&self) -> Option<u32> {
        self.last_delivery
    }

    fn delivery_count(&self) -> Option<u32> {
        match self.header_value("x-delivery-count")? {
            AMQPValue::LongLongInt(n) => u32::try_from(*n).ok().map(|n| n + 1),
            AMQPValue::LongInt(n) => u32::try_from(*n).ok().map(|n| n + 1),
            _ => None,
        }
    }
}
