//! Dead-letter copies: produced to `<topic>.dead` with the source's
//! topic, partition and offset, and acknowledged before the offset moves.

use std::time::Duration;

use idem::{Codec, Key, Store};
use idem_consumer::DeadLetter;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use rdkafka::Message as _;
use tokio::sync::watch;

use crate::lane::LaneState;
use crate::message::KafkaMessage;
use crate::shared::Shared;

/// Header with the topic a dead-lettered record was read from.
pub const SOURCE_TOPIC_HEADER: &str = "Idem-Source-Topic";

/// Header with the partition a dead-lettered record was read from.
pub const SOURCE_PARTITION_HEADER: &str = "Idem-Source-Partition";

/// Header with the offset of a dead-lettered record.
pub const SOURCE_OFFSET_HEADER: &str = "Idem-Source-Offset";

/// The suffix of a topic's default dead-letter topic.
pub const DEAD_LETTER_SUFFIX: &str = ".dead";

/// How long a dead-letter copy may take before it counts as failed (and
/// is tried again).
const DEAD_LETTER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a lane waits before trying a failed dead-letter copy again.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(2);

impl<S: Store, C: Codec> Shared<S, C> {
    /// Produces the dead-letter copy of `record` and waits for the broker
    /// to acknowledge it, trying again until it does; false when the lane
    /// ended first (the record stays uncommitted and is delivered again).
    pub(crate) async fn dead_letter(
        &self,
        record: &KafkaMessage,
        key: Option<&Key>,
        reason: &str,
        state: &LaneState,
        stop: &watch::Receiver<bool>,
    ) -> bool {
        let Some(topic) = self.dead_letters.get(record.topic()) else {
            tracing::error!(
                topic = record.topic(),
                "no dead-letter topic for this topic"
            );
            return false;
        };
        let (partition, offset) = (record.partition().to_string(), record.offset().to_string());
        loop {
            let mut headers = OwnedHeaders::new();
            for (name, value) in record.headers() {
                headers = headers.insert(Header { key: name, value });
            }
            let letter = DeadLetter {
                reason,
                key,
                consumer: self.consumer.name(),
            }
            .headers();
            let source = [
                (SOURCE_TOPIC_HEADER, record.topic()),
                (SOURCE_PARTITION_HEADER, partition.as_str()),
                (SOURCE_OFFSET_HEADER, offset.as_str()),
            ];
            let added = letter.iter().map(|(name, value)| (*name, value.as_str()));
            for (name, value) in added.chain(source) {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value),
                });
            }
            let mut copy: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
            if let Some(payload) = record.as_rdkafka().payload() {
                copy = copy.payload(payload);
            }
            if let Some(record_key) = record.record_key() {
                copy = copy.key(record_key);
            }
            match self
                .producer
                .send(copy, Timeout::After(DEAD_LETTER_TIMEOUT))
                .await
            {
                Ok(_) => return true,
                Err((error, _)) => tracing::warn!(
                    %error, dead_letter_topic = %topic,
                    "dead-letter copy failed; trying again"
                ),
            }
            if !state.sleep(DEAD_LETTER_RETRY, stop).await {
                return false;
            }
        }
    }
}
