//! What a consumer decides for a delivery, and the job its handler gets.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem::{Context, Key, RecordId, Terminal};
use serde::de::DeserializeOwned;

use crate::Message;

/// What the adapter does with a delivery, per docs/design.md §9.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Acknowledge it (Kafka: commit past it): the effect is recorded.
    Ack(Acked),
    /// Give it back to the broker to deliver again after `after`; nothing
    /// is recorded as done.
    Retry {
        /// How long to wait before the next delivery.
        after: Duration,
        /// Why.
        cause: RetryCause,
    },
    /// Move it to the dead-letter destination with `reason`, then
    /// acknowledge it: no number of redeliveries would help.
    DeadLetter {
        /// Why, for whoever reads the dead-letter destination.
        reason: String,
    },
}

/// Why a delivery was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acked {
    /// The handler ran now and its outcome was stored.
    Executed,
    /// A duplicate: the handler had already completed for this key.
    Replayed,
    /// The store was down and the consumer fails open: the handler ran
    /// without deduplication.
    Unguarded,
}

/// Why a delivery is to be delivered again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryCause {
    /// Another worker holds a live claim on the key. Nothing ran here; the
    /// message is kept so it is not lost if that worker dies.
    InProgress,
    /// The handler failed retryably on this attempt.
    Failed {
        /// The attempt that failed (1 for the first).
        attempt: u32,
        /// The handler's error.
        error: String,
    },
    /// The handler ran but its lease was taken over before it could store
    /// its outcome; the redelivery replays whatever the new holder stores.
    LeaseLost,
    /// The store could not be reached before the handler ran
    /// (fail-closed: nothing ran).
    Store(String),
    /// The handler ran, but the store could not be reached to keep its
    /// outcome. The claim stays until its lease runs out; the redelivery
    /// then replays the outcome if it was kept after all, or takes over
    /// (the handler's effects should be fenced or journaled for that).
    Unstored(String),
    /// The handler panicked. Its claim is left to run out, as a crash
    /// would leave it; the redelivery takes over after the lease, and a
    /// message that keeps panicking becomes terminal after the attempts.
    Panicked(String),
    /// The key was parked with a step in doubt, and the reconciler
    /// settled it ([`crate::reconcile`]): the redelivery resumes the run.
    Reconciled,
}

impl fmt::Display for RetryCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryCause::InProgress => f.write_str("in progress elsewhere"),
            RetryCause::Failed { attempt, error } => {
                write!(f, "attempt {attempt} failed: {error}")
            }
            RetryCause::LeaseLost => f.write_str("lease lost before the outcome was stored"),
            RetryCause::Store(error) => {
                write!(f, "idempotency store unavailable, nothing ran: {error}")
            }
            RetryCause::Unstored(error) => write!(
                f,
                "the handler ran, but the idempotency store could not keep its outcome: {error}"
            ),
            RetryCause::Panicked(message) => write!(f, "handler panicked: {message}"),
            RetryCause::Reconciled => {
                f.write_str("parked, and settled by the reconciler: the run resumes")
            }
        }
    }
}

/// Why [`Consumer::run`](super::Consumer::run) returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// The shutdown future resolved.
    Shutdown,
    /// The message stream ended (the broker ended the consumer, or the
    /// adapter stopped the stream on an error).
    Ended,
}

/// A disposition and the key it was decided for (`None` when no key could
/// be read), for the adapter to put on dead-letters and in logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The delivery's key.
    pub key: Option<Key>,
    /// What to do with the delivery.
    pub disposition: Disposition,
}

/// One delivery, handed to the handler: its record id, the message and the
/// executor's [`Context`] (lease, fence, lease-loss signal).
#[derive(Debug)]
pub struct Job<M> {
    pub(super) id: RecordId,
    pub(super) message: Arc<M>,
    pub(super) ctx: Context,
}

impl<M: Message> Job<M> {
    /// The scope and key this delivery runs under.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The idempotency key.
    pub fn key(&self) -> &Key {
        self.id.key()
    }

    /// The broker's message.
    pub fn message(&self) -> &M {
        &self.message
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        self.message.payload()
    }

    /// The payload decoded as JSON. A payload that does not decode is a
    /// [`Terminal`] error: retrying cannot fix it, so it is dead-lettered.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, Terminal> {
        serde_json::from_slice(self.payload()).map_err(|error| {
            Terminal::new(format!(
                "payload is not a valid {}: {error}",
                std::any::type_name::<T>()
            ))
        })
    }

    /// The executor's context: [`Context::fence`] for downstream writes,
    /// [`Context::ensure_lease`] before irreversible steps.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }
}
