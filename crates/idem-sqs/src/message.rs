//! A received message as the consumer sees it, with the queue it came
//! from.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::Client;
use bytes::Bytes;
use idem_consumer::Message;

/// The longest visibility timeout SQS accepts (12 hours).
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// What a message's id is called: SQS assigns it at each send.
pub(crate) const MESSAGE_ID: &str = "SQS's MessageId";

/// One received SQS message.
pub struct SqsMessage {
    pub(crate) body: Bytes,
    pub(crate) message_id: String,
    pub(crate) receipt: String,
    pub(crate) attributes: HashMap<String, String>,
    system: HashMap<String, String>,
    receive_count: Option<u32>,
    pub(crate) queue: Arc<Queue>,
}

/// The queue a message came from, for its visibility extensions.
pub(crate) struct Queue {
    pub(crate) client: Client,
    pub(crate) url: String,
    pub(crate) visibility: Duration,
    /// The `maxReceiveCount` of the queue's accepted `RedrivePolicy`: the
    /// last receive of a message before SQS moves it aside.
    pub(crate) last_receive: Option<u32>,
}

impl std::fmt::Debug for SqsMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsMessage")
            .field("message_id", &self.message_id)
            .field("receive_count", &self.receive_count)
            .finish_non_exhaustive()
    }
}

impl SqsMessage {
    /// The message attributes of type String or Number.
    pub fn attributes(&self) -> &HashMap<String, String> {
        &self.attributes
    }

    /// The FIFO message group, if any.
    pub fn group_id(&self) -> Option<&str> {
        self.system.get("MessageGroupId").map(String::as_str)
    }

    /// The receipt handle of this delivery.
    pub fn receipt_handle(&self) -> &str {
        &self.receipt
    }

    pub(crate) fn from_sdk(
        message: aws_sdk_sqs::types::Message,
        queue: &Arc<Queue>,
    ) -> Option<Self> {
        let receipt = message.receipt_handle?;
        let attributes = message
            .message_attributes
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, value)| value.string_value.map(|v| (name, v)))
            .collect();
        let system: HashMap<String, String> = message
            .attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, value)| (name.as_str().to_owned(), value))
            .collect();
        Some(Self {
            body: Bytes::from(message.body.unwrap_or_default()),
            message_id: message.message_id.unwrap_or_default(),
            receive_count: system
                .get("ApproximateReceiveCount")
                .and_then(|c| c.parse().ok()),
            receipt,
            attributes,
            system,
            queue: Arc::clone(queue),
        })
    }
}

impl Message for SqsMessage {
    fn payload(&self) -> &[u8] {
        &self.body
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.attributes
            .get(name)
            .or_else(|| match name {
                "MessageDeduplicationId" | "MessageGroupId" | "SenderId" => self.system.get(name),
                _ => None,
            })
            .map(String::as_str)
    }

    fn message_id(&self) -> Option<&str> {
        Some(&self.message_id)
    }

    fn message_id_per_send(&self) -> Option<&'static str> {
        Some(MESSAGE_ID)
    }

    fn delivery_count(&self) -> Option<u32> {
        self.receive_count
    }

    fn last_delivery(&self) -> Option<u32> {
        self.queue.last_receive
    }

    async fn keep_alive(&self) {
        let extended = self
            .queue
            .client
            .change_message_visibility()
            .queue_url(&self.queue.url)
            .receipt_handle(&self.receipt)
            .visibility_timeout(seconds(self.queue.visibility))
            .send()
            .await;
        if let Err(error) = extended {
            tracing::warn!(
                error = %DisplayErrorContext(&error),
                "visibility extension failed; SQS may deliver the message again"
            );
        }
    }
}

/// Whole seconds for SQS, rounded up and capped at 12 hours.
pub(crate) fn seconds(d: Duration) -> i32 {
    let d = d.min(MAX_VISIBILITY);
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_is_whole_seconds_rounded_up_and_capped() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_secs(2)), 2);
        assert_eq!(seconds(Duration::from_millis(2001)), 3);
        assert_eq!(seconds(Duration::from_secs(100_000)), 43_200);
        assert_eq!(seconds(Duration::ZERO), 0);
    }
}
