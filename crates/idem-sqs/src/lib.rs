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
//! [`Message::header`](idem_consumer::Message::header) reads message attributes (string and number), then
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
//!   messages itself, with the reason. An accepted policy's
//!   `maxReceiveCount` is read: a message's last receive before SQS would
//!   move it is dead-lettered by idem with the reason instead of being run
//!   (see [`idem_consumer::Message::last_delivery`]); every retry and
//!   every claim found in progress is a receive too.
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

mod broker;
mod builder;
mod client;
mod consumer;
mod error;
mod message;
mod sender;

pub use broker::SOURCE_ATTRIBUTE;
pub use builder::{SqsConsumerBuilder, DEFAULT_CONCURRENCY, DEFAULT_WAIT};
pub use client::{client_for, client_from_env, client_from_options, ConfigError};
pub use consumer::SqsConsumer;
pub use error::SqsError;
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
pub use message::SqsMessage;
pub use sender::{SqsSender, GROUP_HEADER};
