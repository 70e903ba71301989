//! # idem-consumer: broker deliveries in, exactly-once effects out
//!
//! The broker-agnostic half of idem's consumer middleware
//! (docs/design.md §9). A delivery goes through
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
//! A broker plugs in by implementing [`Broker`] (deliveries, ack, retry,
//! dead-letter copy); [`Consumer::run`] is the one consume loop and holds
//! the policy from disposition to broker calls, with one dead-letter
//! vocabulary ([`DeadLetter`]). The adapters (`idem-rabbitmq`,
//! `idem-nats`, `idem-sqs`) are such implementations; `idem-kafka` keeps
//! its per-partition lanes and shares the vocabulary. [`MemoryBroker`] is
//! an in-process at-least-once broker for examples and tests.
//! [`Consumer::check_windows`]
//! refuses, at start-up, a record retention shorter than the broker's
//! redelivery window.
//!
//! How each outcome becomes a disposition:
//!
#![doc = include_str!("../docs/dispositions.md")]
//!
//! The mapping avoids the classic ways to lose or duplicate a message:
//!
//! - a duplicate whose first delivery is still running elsewhere is
//!   **retried later, never acked**: acking it would lose the message if
//!   that worker died;
//! - a message is acked only **after** its outcome is stored, so a failed
//!   or crashed handler leaves the message with the broker;
//! - a handler is never run while another holds the claim.

mod ahead;
mod broker;
mod consumer;
mod key;
mod memory;
mod message;
pub mod metrics;
pub mod reconcile;
mod run;
mod window;

pub use broker::{
    Broker, DeadLetter, Deliveries, SettleError, CONSUMER_HEADER, KEY_HEADER, REASON_HEADER,
};

pub use consumer::{
    Acked, Consumer, ConsumerBuilder, ConsumerStats, Decision, Disposition, Job, RetryCause,
    Stopped,
};
pub use key::{KeyExtractor, KeyProblem, KeySource, MissingKey};
pub use memory::{MemoryBroker, MemoryMessage, DEFAULT_VISIBILITY};
pub use message::{Message, OwnedMessage};
pub use run::SETTLE_TIMEOUT;
pub use window::{check_keep_alive, RedeliveryWindow, WindowError};
