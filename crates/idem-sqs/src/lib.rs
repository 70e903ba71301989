//! # idem-sqs: exactly-once effects for Amazon SQS consumers
//!
//! Receives from a standard or FIFO queue, runs every message through
//! [`idem_consumer::Consumer`] and carries out its [`Disposition`](idem_consumer::Disposition):
//!
//! | disposition | what happens on the queue |
//! |---|---|
//! | ack | `DeleteMessage` |
//! | retry after *d* | `ChangeMessageVisibility` to *d*: SQS delivers it again after *d* |
//! | dead-letter | a copy is sent to the dead-letter queue (default `<queue>-dead`, created if missing) with message attributes `Idem-Reason`, `Idem-Key`, `Idem-Consumer` and `Idem-Source-Message-Id`, and once SQS has accepted it the original is deleted |
//!
//! While a handler runs, every lease extension the store confirms also
//! resets the message's visibility timeout, so a long handler is not
//! delivered to another worker while its claim is alive; once the claim
//! is lost (the worker hangs or dies) the extensions stop and SQS
//! delivers the message again. A dead-letter copy SQS does not accept
//! leaves the original where it is, to be retried after the longest retry
//! delay: it is never lost.
//!
//! SQS FIFO deduplication lasts five minutes and standard queues deliver
//! duplicates freely; the idempotency record is what makes the effect
//! happen once. Keys come from the consumer's [`KeyExtractor`](idem_consumer::KeyExtractor):
//! [`Message::header`] reads message attributes (string and number), then
//! the system attributes `MessageDeduplicationId`, `MessageGroupId` and
//! `SenderId`. The consumer's default falls back to SQS's `MessageId`,
//! which protects against redeliveries of one send but not against a
//! producer sending twice (each send gets a new id): producers should set
//! an `Idempotency-Key` attribute, or the consumer should read the key
//! from the payload.
//!
//! ## Start-up checks
//!
//! - the queue must exist;
//! - record retention must exceed the queue's `MessageRetentionPeriod`
//!   (how long a message, and so its redelivery, can stay);
//! - the queue's `VisibilityTimeout` must be longer than the heartbeat;
//! - a `RedrivePolicy` is refused unless accepted with
//!   [`SqsConsumerBuilder::accept_redrive_policy`]: SQS moves a message to
//!   its dead-letter queue after `maxReceiveCount` receives without saying
//!   why, which would also move a message that only kept meeting a claim
//!   in progress, or a store that was down. idem dead-letters poison
//!   messages itself, with the reason.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, Scope};
//! use idem_consumer::{Consumer, KeyExtractor};
//! use idem_sqs::{client_from_env, SqsConsumer};
//!
//! let table = idem_dynamodb::client_from_env(None)?;
//! let store = idem_dynamodb::DynamoStore::new(table, "idem_records");
//! let idem = Idempotency::builder(store).build()?;
//! let consumer = Consumer::builder(idem, Scope::new("orders")?)
//!     .keys(KeyExtractor::header("Idempotency-Key"))
//!     .build();
//! let queue = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
//! let sqs = SqsConsumer::builder(client_from_env(None)?, queue, consumer)
//!     .connect()
//!     .await?;
//! sqs.run(
//!     |job| async move {
//!         let order: serde_json::Value = job.json()?;
//!         Ok::<_, idem::Terminal>(order["id"].clone())
//!     },
//!     async { tokio::signal::ctrl_c().await.ok(); },
//! )
//! .await?;
//! # Ok(())
//! # }
//! ```

use std::collections::{HashMap, VecDeque};
use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use bytes::Bytes;
use idem::{Codec, Store};
use idem_consumer::{
    Broker, Consumer, DeadLetter, Deliveries, Job, Message, RedeliveryWindow, SettleError, Stopped,
};
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
use serde::de::DeserializeOwned;
use serde::Serialize;

mod client;

pub use client::{client_for, client_from_env, ConfigError};

/// The concurrency (messages in flight per worker) unless configured.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// How long a receive waits for messages (SQS's longest long poll).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(20);

/// Attribute with the SQS message id of the dead-lettered original.
pub const SOURCE_ATTRIBUTE: &str = "Idem-Source-Message-Id";

/// SQS allows at most 10 message attributes per message.
const MAX_ATTRIBUTES: usize = 10;
/// The longest visibility timeout SQS accepts (12 hours).
const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);
/// How long the receive loop waits after a failed receive.
const RECEIVE_BACKOFF: Duration = Duration::from_secs(1);

/// Why the consumer could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqsError {
    /// An SQS request failed (queue missing, access denied, unreachable).
    #[error("{what}: {detail}")]
    Request {
        /// What was being done.
        what: String,
        /// SQS's or the client's error.
        detail: String,
    },
    /// The configuration would lose or duplicate messages, or is invalid.
    #[error("invalid SQS consumer configuration: {0}")]
    Config(String),
    /// Record retention or the heartbeat does not cover the queue's
    /// windows.
    #[error(transparent)]
    Window(#[from] idem_consumer::WindowError),
    /// The message stream ended while consuming.
    #[error("consuming {queue:?} failed: {reason}")]
    Consume {
        /// The queue.
        queue: String,
        /// What happened.
        reason: String,
    },
}

fn request_error<E: StdError + 'static>(what: impl Into<String>) -> impl FnOnce(E) -> SqsError {
    let what = what.into();
    move |e| SqsError::Request {
        what,
        detail: error_text(e),
    }
}

/// An SDK error with its sources, as one line.
fn error_text<E: StdError>(e: E) -> String {
    DisplayErrorContext(e).to_string()
}

/// One received SQS message.
pub struct SqsMessage {
    body: Bytes,
    message_id: String,
    receipt: String,
    attributes: HashMap<String, String>,
    system: HashMap<String, String>,
    receive_count: Option<u32>,
    queue: Arc<Queue>,
}

/// The queue a message came from, for its visibility extensions.
struct Queue {
    client: Client,
    url: String,
    visibility: Duration,
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

    fn from_sdk(message: aws_sdk_sqs::types::Message, queue: &Arc<Queue>) -> Option<Self> {
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

    fn delivery_count(&self) -> Option<u32> {
        self.receive_count
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
fn seconds(d: Duration) -> i32 {
    let d = d.min(MAX_VISIBILITY);
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Builds an [`SqsConsumer`].
pub struct SqsConsumerBuilder<S, C> {
    client: Client,
    queue_url: String,
    consumer: Consumer<S, C>,
    concurrency: usize,
    wait: Duration,
    dead_letter_url: Option<String>,
    accept_redrive: bool,
}

impl<S: Store, C: Codec> SqsConsumerBuilder<S, C> {
    /// Messages processed at once (default 16).
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// How long a receive waits for messages (default 20 s, at most 20 s).
    #[must_use]
    pub fn wait_time(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Where dead-letter copies go (default: the queue `<queue>-dead`, or
    /// `<queue>-dead.fifo` for a FIFO queue, created if missing).
    #[must_use]
    pub fn dead_letter_queue(mut self, url: impl Into<String>) -> Self {
        self.dead_letter_url = Some(url.into());
        self
    }

    /// Accepts a queue with a `RedrivePolicy` (see the crate docs for why
    /// it is refused by default).
    #[must_use]
    pub fn accept_redrive_policy(mut self) -> Self {
        self.accept_redrive = true;
        self
    }

    /// Reads and checks the queue's attributes, and creates the
    /// dead-letter queue if it is missing.
    pub async fn connect(self) -> Result<SqsConsumer<S, C>, SqsError> {
        if self.concurrency == 0 {
            return Err(SqsError::Config(
                "concurrency must be at least 1".to_owned(),
            ));
        }
        if self.wait > DEFAULT_WAIT {
            return Err(SqsError::Config(format!(
                "wait_time {:?} is longer than SQS's longest long poll (20 s)",
                self.wait
            )));
        }
        let url = &self.queue_url;
        let attributes = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(request_error(format!(
                "reading the attributes of queue {url}"
            )))?
            .attributes
            .unwrap_or_default();
        let number = |name: QueueAttributeName| -> Result<u64, SqsError> {
            let text = attributes.get(&name).ok_or_else(|| {
                SqsError::Config(format!("queue {url} did not report {}", name.as_str()))
            })?;
            text.parse().map_err(|_| {
                SqsError::Config(format!("queue {url} reported {} = {text:?}", name.as_str()))
            })
        };
        let retention = Duration::from_secs(number(QueueAttributeName::MessageRetentionPeriod)?);
        let visibility = Duration::from_secs(number(QueueAttributeName::VisibilityTimeout)?);
        self.consumer.check_windows(&[RedeliveryWindow::new(
            format!("queue {url} MessageRetentionPeriod"),
            retention,
        )])?;
        idem_consumer::check_keep_alive(
            self.consumer.idempotency(),
            &format!("queue {url} VisibilityTimeout"),
            visibility,
        )?;
        if let Some(policy) = attributes.get(&QueueAttributeName::RedrivePolicy) {
            if !self.accept_redrive {
                return Err(SqsError::Config(format!(
                    "queue {url} has RedrivePolicy {policy}: SQS moves a message to its \
                     dead-letter queue after maxReceiveCount receives without saying why, \
                     which would also move a message that only met a claim in progress or a \
                     store that was down. Remove it (idem dead-letters poison messages \
                     itself, with the reason) or call accept_redrive_policy()"
                )));
            }
        }
        let fifo = url.ends_with(".fifo");
        let dead_letter_url = match self.dead_letter_url {
            Some(dead) => dead,
            None => create_dead_letter_queue(&self.client, url, fifo).await?,
        };
        Ok(SqsConsumer {
            broker: Arc::new(Sqs {
                queue: Arc::new(Queue {
                    client: self.client,
                    url: self.queue_url,
                    visibility,
                }),
                dead_letter_url,
                fifo,
                concurrency: self.concurrency,
                wait: self.wait,
            }),
            consumer: self.consumer,
        })
    }
}

/// Creates (or finds) `<queue>-dead`, FIFO if the queue is.
async fn create_dead_letter_queue(
    client: &Client,
    url: &str,
    fifo: bool,
) -> Result<String, SqsError> {
    let name = url.rsplit('/').next().unwrap_or(url);
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    let dead = if fifo {
        format!("{base}-dead.fifo")
    } else {
        format!("{base}-dead")
    };
    let mut request = client
        .create_queue()
        .queue_name(&dead)
        .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600");
    if fifo {
        request = request.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let created = request
        .send()
        .await
        .map_err(request_error(format!("creating dead-letter queue {dead}")))?;
    created.queue_url.ok_or_else(|| SqsError::Request {
        what: format!("creating dead-letter queue {dead}"),
        detail: "SQS returned no queue URL".to_owned(),
    })
}

/// An SQS consumer that runs every message through idem.
pub struct SqsConsumer<S, C> {
    broker: Arc<Sqs>,
    consumer: Consumer<S, C>,
}

impl<S: Store> SqsConsumer<S, idem::Json> {
    /// A consumer of the queue at `queue_url`.
    pub fn builder<C: Codec>(
        client: Client,
        queue_url: &str,
        consumer: Consumer<S, C>,
    ) -> SqsConsumerBuilder<S, C> {
        SqsConsumerBuilder {
            client,
            queue_url: queue_url.to_owned(),
            consumer,
            concurrency: DEFAULT_CONCURRENCY,
            wait: DEFAULT_WAIT,
            dead_letter_url: None,
            accept_redrive: false,
        }
    }
}

impl<S, C> SqsConsumer<S, C>
where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// The consumer layer, for its [`stats`](Consumer::stats).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.consumer
    }

    /// The queue dead-letter copies are sent to.
    pub fn dead_letter_queue(&self) -> &str {
        &self.broker.dead_letter_url
    }

    /// Consumes until `shutdown` resolves, then takes no more messages,
    /// lets those in flight finish and settle, and returns. Messages
    /// received but not yet handed to a handler stay invisible until their
    /// visibility timeout runs out and are delivered again: nothing is
    /// lost.
    pub async fn run<H, Fut, T, E>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), SqsError>
    where
        H: Fn(Job<SqsMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        match self.consumer.run(&self.broker, handler, shutdown).await? {
            Stopped::Shutdown => Ok(()),
            Stopped::Ended => Err(SqsError::Consume {
                queue: self.broker.queue.url.clone(),
                reason: "the message stream ended".to_owned(),
            }),
        }
    }
}

/// The SQS side of the consume loop.
struct Sqs {
    queue: Arc<Queue>,
    dead_letter_url: String,
    fifo: bool,
    concurrency: usize,
    wait: Duration,
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
