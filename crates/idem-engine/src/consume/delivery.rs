//! [`Delivery`] and [`Settlement`]: a broker's message as a binding hands
//! it over, and what the consumer layer decided for it.

use std::time::Duration;

use idem_consumer::{Acked, DeadLetter, Decision, Disposition, Message};

/// A message as the broker client delivered it.
#[derive(Debug, Clone, Default)]
pub struct Delivery {
    /// The payload.
    pub payload: Vec<u8>,
    /// Its headers (AMQP headers, SQS message attributes), as text.
    pub headers: Vec<(String, String)>,
    /// The broker's own message id, if it has one.
    pub message_id: Option<String>,
    /// How many times the broker delivered it, this one included, when it
    /// says (RabbitMQ quorum queues' `x-delivery-count` + 1, SQS's
    /// `ApproximateReceiveCount`).
    pub delivery_count: Option<u32>,
}

impl Message for Delivery {
    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn message_id(&self) -> Option<&str> {
        self.message_id.as_deref()
    }

    fn delivery_count(&self) -> Option<u32> {
        self.delivery_count
    }
}

/// What to do with a delivery on the broker (docs/design.md §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Acknowledge it: the effect is recorded (`ack`).
    Ack,
    /// Deliver it again after [`Settlement::after`] (`retry`).
    Retry,
    /// Move it to the dead-letter destination with
    /// [`Settlement::dead_letter_headers`], then acknowledge it
    /// (`dead_letter`).
    DeadLetter,
}

impl Action {
    /// `ack`, `retry` or `dead_letter`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Ack => "ack",
            Action::Retry => "retry",
            Action::DeadLetter => "dead_letter",
        }
    }
}

/// The consumer layer's decision for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// What to do.
    pub action: Action,
    /// For a retry, how long to wait before the next delivery.
    pub after: Option<Duration>,
    /// Why (a retry's cause, a dead-letter's reason); `None` for an ack.
    pub reason: Option<String>,
    /// For an ack, whether the delivery was a duplicate of a completed one.
    pub replayed: bool,
    /// The delivery's key, when one could be read.
    pub key: Option<String>,
    /// The headers a dead-letter copy carries (`Idem-Reason`, `Idem-Key`,
    /// `Idem-Consumer`: idem's one vocabulary); empty unless dead-lettered.
    pub dead_letter_headers: Vec<(String, String)>,
}

impl Settlement {
    pub(crate) fn of(decision: Decision, consumer: &str) -> Self {
        let key = decision.key.as_ref().map(|k| k.as_str().to_owned());
        let settle = |action, after, reason, replayed| Self {
            action,
            after,
            reason,
            replayed,
            key: key.clone(),
            dead_letter_headers: Vec::new(),
        };
        match decision.disposition {
            Disposition::Ack(acked) => {
                settle(Action::Ack, None, None, matches!(acked, Acked::Replayed))
            }
            Disposition::Retry { after, cause } => {
                settle(Action::Retry, Some(after), Some(cause.to_string()), false)
            }
            Disposition::DeadLetter { reason } => {
                let letter = DeadLetter {
                    reason: &reason,
                    key: decision.key.as_ref(),
                    consumer,
                };
                let headers = letter
                    .headers()
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value))
                    .collect();
                Self {
                    dead_letter_headers: headers,
                    ..settle(Action::DeadLetter, None, Some(reason), false)
                }
            }
            // A disposition newer than this engine: delivered again, never
            // lost.
            _ => settle(
                Action::Retry,
                Some(Duration::from_secs(1)),
                Some("unknown disposition".to_owned()),
                false,
            ),
        }
    }
}
