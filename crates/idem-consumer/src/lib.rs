//! # idem-consumer: broker deliveries in, exactly-once effects out
//!
//! The broker-agnostic half of idem's consumer middleware
//! (DESIGN.md §9). A delivery goes through
//!
//! 1. **key extraction** ([`KeyExtractor`]): a header, the broker's
//!    message id, a JSON pointer, a composite of fields, or a content hash;
//!    a delivery without a key is dead-lettered or content-hashed, as
//!    configured — never silently processed unguarded;
//! 2. **the executor** ([`idem::Idempotency`]): claim, heartbeat, store
//!    the outcome, replay it to duplicates;
//! 3. **a disposition** ([`Disposition`]): ack, retry after a delay, or
//!    dead-letter with a reason.
//!
//! Broker adapters (`idem-rabbitmq`, `idem-nats`, `idem-sqs`,
//! `idem-kafka`) wrap their messages in [`Message`] and carry out the
//! disposition. [`Consumer::check_windows`]
//! refuses, at start-up, a record retention shorter than the broker's
//! redelivery window.
//!
//! The mapping avoids the classic ways to lose or duplicate a message:
//!
//! - a duplicate whose first delivery is still running elsewhere is
//!   **retried later, never acked**: acking it would lose the message if
//!   that worker died;
//! - a message is acked only **after** its outcome is stored, so a failed
//!   or crashed handler leaves the message with the broker;
//! - a handler is never run while another holds the claim.

mod consumer;
mod key;
mod message;
pub mod metrics;
mod window;

pub use consumer::{
    Acked, Consumer, ConsumerBuilder, ConsumerStats, Decision, Disposition, Job, RetryCause,
    Stopped,
};
pub use key::{KeyExtractor, KeyProblem, KeySource, MissingKey};
pub use message::{Message, OwnedMessage};
pub use window::{check_keep_alive, RedeliveryWindow, WindowError};
