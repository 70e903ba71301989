//! A Kafka record as the consumer layer sees it.

use rdkafka::message::{Headers, OwnedMessage};
use rdkafka::Message as _;

/// What a record's message id is called: its position, new at each send.
pub(crate) const MESSAGE_ID: &str = "the record's topic/partition@offset";

/// A record taken from a partition: its payload and headers, its place in
/// the log, and the id the consumer layer falls back to when no key is
/// configured (`topic/partition@offset`).
#[derive(Debug)]
pub struct KafkaMessage {
    inner: OwnedMessage,
    id: String,
}

impl KafkaMessage {
    pub(crate) fn new(inner: OwnedMessage) -> Self {
        let id = format!("{}/{}@{}", inner.topic(), inner.partition(), inner.offset());
        Self { inner, id }
    }

    /// The topic it was read from.
    pub fn topic(&self) -> &str {
        self.inner.topic()
    }

    /// The partition it was read from.
    pub fn partition(&self) -> i32 {
        self.inner.partition()
    }

    /// Its offset in the partition.
    pub fn offset(&self) -> i64 {
        self.inner.offset()
    }

    /// The record key (Kafka's partitioning key, usually an entity id; not
    /// an idempotency key unless the producer made it one).
    pub fn record_key(&self) -> Option<&[u8]> {
        self.inner.key()
    }

    /// Every header as (name, value), in the order the producer wrote them.
    pub fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.inner
            .headers()
            .into_iter()
            .flat_map(|h| h.iter().map(|h| (h.key, h.value)))
    }

    /// The librdkafka record.
    pub fn as_rdkafka(&self) -> &OwnedMessage {
        &self.inner
    }
}

impl idem_consumer::Message for KafkaMessage {
    /// The payload; a tombstone (no payload) reads as empty.
    fn payload(&self) -> &[u8] {
        self.inner.payload().unwrap_or_default()
    }

    /// The last header of that name whose value is UTF-8 text (Kafka
    /// allows a name more than once; the last one written wins, as in
    /// Kafka's own `lastHeader`).
    fn header(&self, name: &str) -> Option<&str> {
        self.headers()
            .filter(|(key, _)| *key == name)
            .filter_map(|(_, value)| std::str::from_utf8(value?).ok())
            .last()
    }

    /// `topic/partition@offset`: the same for every redelivery of this
    /// record, different for a second send of the same content.
    fn message_id(&self) -> Option<&str> {
        Some(&self.id)
    }

    fn message_id_per_send(&self) -> Option<&'static str> {
        Some(MESSAGE_ID)
    }
}
