//! # idem-nats: exactly-once effects for NATS JetStream consumers
//!
//! Runs every message of a durable pull consumer through
//! [`idem_consumer::Consumer`] and carries out its [`Disposition`](idem_consumer::Disposition):
//!
//! | disposition | what happens on the server |
//! |---|---|
//! | ack | `+ACK` |
//! | retry after *d* | `-NAK {"delay": d}`: JetStream redelivers after *d* |
//! | dead-letter | a copy is published to the dead-letter subject (default `idem.dead.<stream>`) with headers `Idem-Reason`, `Idem-Key`, `Idem-Consumer`, `Idem-Subject` and `Idem-Stream-Sequence`, and once JetStream has stored it, `+TERM` stops redelivery |
//!
//! While a handler runs, every lease extension the store confirms also
//! sends `+WPI` (work in progress), which restarts the consumer's
//! `ack_wait`: a long handler is not redelivered to another worker while
//! its claim is alive, and as soon as the claim is lost (the worker hangs
//! or dies), the in-progress acks stop and JetStream redelivers.
//!
//! A dead-letter copy that JetStream does not store (no stream captures
//! the subject, or the server is away) is not a dead-letter: the message
//! is NAK'd with the longest retry delay instead, so it is never lost.
//! [`NatsConsumerBuilder::connect`] creates a stream `<stream>_DEAD` for the
//! dead-letter subject unless one already captures it.
//!
//! ## Start-up checks
//!
//! - the stream must exist;
//! - record retention must exceed the stream's `max_age` (how long a
//!   message, and so its redelivery, can stay) and `duplicate_window`; a
//!   stream keeping messages forever (`max_age` 0) needs a stated
//!   [`redelivery_window`](NatsConsumerBuilder::redelivery_window);
//! - the consumer (created if missing, durable, explicit acks) must have an
//!   `ack_wait` longer than the heartbeat, and an unlimited `max_deliver`:
//!   JetStream silently stops delivering a message after `max_deliver`
//!   tries, which would lose a message that met a claim in progress.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, Scope};
//! use idem_consumer::{Consumer, KeyExtractor};
//! use idem_nats::NatsConsumer;
//!
//! let store = idem_redis::RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let idem = Idempotency::builder(store).build()?;
//! let consumer = Consumer::builder(idem, Scope::new("orders")?)
//!     .keys(KeyExtractor::header("Nats-Msg-Id"))
//!     .build();
//! let nats = NatsConsumer::builder("nats://127.0.0.1:4222", "ORDERS", "billing", consumer)
//!     .connect()
//!     .await?;
//! nats.run(
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
mod consumer;
mod error;
mod message;
mod sender;

pub use broker::{SEQUENCE_HEADER, SUBJECT_HEADER};
pub use builder::{NatsConsumerBuilder, DEFAULT_ACK_WAIT, DEFAULT_CONCURRENCY};
pub use consumer::NatsConsumer;
pub use error::NatsError;
pub use idem_consumer::{CONSUMER_HEADER, KEY_HEADER, REASON_HEADER};
pub use message::NatsMessage;
pub use sender::{JetStreamSender, MSG_ID_HEADER};
