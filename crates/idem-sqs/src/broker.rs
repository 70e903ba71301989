//! The queue as `idem-consumer` drives it: messages received by long
//! polling, settlements (delete, a visibility change, a dead-letter copy)
//! out.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
use idem_consumer::{Broker, DeadLetter, Deliveries, SettleError};

use crate::error::{error_text, SqsError};
use crate::message::{seconds, Queue, SqsMessage};

/// Attribute with the SQS message id of the dead-lettered original.
pub const SOURCE_ATTRIBUTE: &str = "Idem-Source-Message-Id";

/// SQS allows at most 10 message attributes per message.
const MAX_ATTRIBUTES: usize = 10;

/// How long the receive loop waits after a failed receive.
const RECEIVE_BACKOFF: Duration = Duration::from_secs(1);

/// The SQS side of the consume loop.
pub(crate) struct Sqs {
    pub(crate) queue: Arc<Queue>,
    pub(crate) dead_letter_url: String,
    pub(crate) fifo: bool,
    pub(crate) concurrency: usize,
    pub(crate) wait: Duration,
}

impl Broker for Sqs {
    type Message = SqsMessage;
    type Error = SqsError;

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    async fn deliveries(&self) -> Result<Deliveries<SqsMessage, SqsError>, SqsError> {
        let receiver = Receiver {
            queue: Arc::clone(&self.queue),
            batch: i32::try_from(self.concurrency.min(10)).unwrap_or(10),
            wait: seconds(self.wait),
            buffer: VecDeque::new(),
        };
        Ok(Box::pin(futures_util::stream::unfold(
            receiver,
            |mut r| async move {
                let next = r.next().await;
                Some((Ok(next), r))
            },
        )))
    }

    /// `DeleteMessage`.
    async fn ack(&self, message: &SqsMessage) -> Result<(), SettleError> {
        let queue = &message.queue;
        queue
            .client
            .delete_message()
            .queue_url(&queue.url)
            .receipt_handle(&message.receipt)
            .send()
            .await
            .map_err(error_text)?;
        Ok(())
    }

    /// `ChangeMessageVisibility` to `after`: SQS delivers it again then.
    async fn retry(&self, message: &SqsMessage, after: Duration) -> Result<(), SettleError> {
        let queue = &message.queue;
        queue
            .client
            .change_message_visibility()
            .queue_url(&queue.url)
            .receipt_handle(&message.receipt)
            .visibility_timeout(seconds(after))
            .send()
            .await
            .map_err(error_text)?;
        Ok(())
    }

    async fn dead_letter(
        &self,
        message: &SqsMessage,
        letter: &DeadLetter<'_>,
    ) -> Result<(), SettleError> {
        let text = |v: &str| {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(v)
                .build()
        };
        let mut attributes = HashMap::new();
        for (name, value) in letter.headers() {
            attributes.insert(name.to_owned(), text(&value)?);
        }
        attributes.insert(SOURCE_ATTRIBUTE.to_owned(), text(&message.message_id)?);
        let mut originals: Vec<_> = message.attributes.iter().collect();
        originals.sort();
        for (name, value) in originals {
            if attributes.len() == MAX_ATTRIBUTES {
                break;
            }
            if !value.is_empty() {
                attributes.entry(name.clone()).or_insert(text(value)?);
            }
        }
        let mut send = message
            .queue
            .client
            .send_message()
            .queue_url(&self.dead_letter_url)
            .message_body(String::from_utf8_lossy(&message.body))
            .set_message_attributes(Some(attributes));
        if self.fifo {
            send = send
                .message_group_id(message.group_id().unwrap_or("idem-dead-letters"))
                .message_deduplication_id(&message.message_id);
        }
        send.send().await.map_err(error_text)?;
        Ok(())
    }
}

/// Long-polls the queue and hands out messages one at a time.
struct Receiver {
    queue: Arc<Queue>,
    batch: i32,
    wait: i32,
    buffer: VecDeque<SqsMessage>,
}

impl Receiver {
    async fn next(&mut self) -> SqsMessage {
        loop {
            if let Some(message) = self.buffer.pop_front() {
                return message;
            }
            let received = self
                .queue
                .client
                .receive_message()
                .queue_url(&self.queue.url)
                .max_number_of_messages(self.batch)
                .wait_time_seconds(self.wait)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await;
            match received {
                Ok(out) => {
                    let queue = &self.queue;
                    self.buffer.extend(
                        out.messages
                            .unwrap_or_default()
                            .into_iter()
                            .filter_map(|m| SqsMessage::from_sdk(m, queue)),
                    );
                }
                Err(error) => {
                    tracing::warn!(error = %DisplayErrorContext(&error), "receive failed; retrying");
                    tokio::time::sleep(RECEIVE_BACKOFF).await;
                }
            }
        }
    }
}
