//! What a broker does for the consume loop, and the one dead-letter
//! vocabulary every adapter writes.

use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use futures_util::stream::BoxStream;
use idem::Key;

use crate::Message;

/// An error from a broker call that settles a delivery. The consume loop
/// logs it and carries on: the broker delivers an unsettled message again.
pub type SettleError = Box<dyn StdError + Send + Sync>;

/// The deliveries of one subscription. An `Err` item ends the run with
/// that error unless [`Broker::resubscribe`] says to subscribe again (the
/// adapter skips, itself, errors its client recovers from on its own).
pub type Deliveries<M, E> = BoxStream<'static, Result<M, E>>;

/// The broker side of the consume loop: where deliveries come from and
/// how each [`Disposition`](crate::Disposition) is carried out.
/// [`Consumer::run`](crate::Consumer::run) holds the policy that maps
/// outcomes to these calls, once for every broker:
///
/// | disposition | calls |
/// |---|---|
/// | ack | [`ack`](Self::ack) |
/// | retry after *d* | [`retry`](Self::retry)`(d)`; if that fails, [`give_back`](Self::give_back) |
/// | dead-letter | [`dead_letter`](Self::dead_letter) (the copy), then [`end_dead_lettered`](Self::end_dead_lettered) (the original); if the copy is not stored, a retry after the longest retry delay, so the message is never lost |
///
/// Every call happens only once the delivery's processing has finished:
/// an ack only after its outcome is stored.
/// Adding a broker means implementing this trait (and, for its tests,
/// the testkit's `BrokerUnderTest`).
pub trait Broker: Send + Sync + 'static {
    /// The broker's delivery.
    type Message: Message;
    /// Why consuming could not start or stopped.
    type Error: StdError + Send + Sync + 'static;

    /// How many deliveries are processed at once (the prefetch window).
    fn concurrency(&self) -> usize;

    /// Starts consuming.
    fn deliveries(
        &self,
    ) -> impl Future<Output = Result<Deliveries<Self::Message, Self::Error>, Self::Error>> + Send;

    /// Acknowledges a delivery whose outcome is stored: it is not
    /// delivered again.
    fn ack(&self, message: &Self::Message) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// Has the broker deliver the message again after `after`, and ends
    /// this delivery.
    fn retry(
        &self,
        message: &Self::Message,
        after: Duration,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// Gives the delivery back at once, when [`retry`](Self::retry)
    /// failed. The default does nothing: the broker delivers an unsettled
    /// message again on its own (visibility or ack timeout, closed
    /// channel).
    fn give_back(&self, message: &Self::Message) -> impl Future<Output = ()> + Send {
        let _ = message;
        async {}
    }

    /// Stores a copy of the message, with `letter`'s headers added, where
    /// dead letters go. Only the copy: the original is ended by
    /// [`end_dead_lettered`](Self::end_dead_lettered) once this returned
    /// `Ok`.
    fn dead_letter(
        &self,
        message: &Self::Message,
        letter: &DeadLetter<'_>,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;

    /// Ends a delivery whose dead-letter copy is stored. The default acks
    /// it; JetStream terminates it instead.
    fn end_dead_lettered(
        &self,
        message: &Self::Message,
    ) -> impl Future<Output = Result<(), SettleError>> + Send {
        self.ack(message)
    }

    /// Whether to subscribe again after the delivery stream failed with
    /// `error`: true for failures the broker's client survives, such as a
    /// channel the broker closed while the connection stays up (RabbitMQ's
    /// `consumer_timeout`). Deliveries in flight settle as usual; those
    /// the failed subscription held and can no longer settle are
    /// delivered again by the broker and meet their key. The default is
    /// false: the run ends with the error.
    fn resubscribe(&self, error: &Self::Error) -> bool {
        let _ = error;
        false
    }

    /// Stops the subscription after the last delivery in flight settled
    /// (cancel the consumer, close the channel). The default does
    /// nothing.
    fn stop(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Header naming why a message was dead-lettered.
pub const REASON_HEADER: &str = "Idem-Reason";
/// Header carrying the idempotency key of a dead-lettered message (absent
/// when none could be read).
pub const KEY_HEADER: &str = "Idem-Key";
/// Header naming the consumer that dead-lettered a message.
pub const CONSUMER_HEADER: &str = "Idem-Consumer";

/// Why and by whom a message was dead-lettered: the headers every
/// adapter puts on the copy, next to its own source headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetter<'a> {
    /// Why, for whoever reads the dead-letter destination.
    pub reason: &'a str,
    /// The delivery's key, when one could be read.
    pub key: Option<&'a Key>,
    /// The consumer's name.
    pub consumer: &'a str,
}

impl<'a> DeadLetter<'a> {
    /// The headers, as `(name, value)`; values are one line (line breaks
    /// become spaces), as header formats require.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            (REASON_HEADER, one_line(self.reason)),
            (CONSUMER_HEADER, one_line(self.consumer)),
        ];
        if let Some(key) = self.key {
            headers.push((KEY_HEADER, one_line(key.as_str())));
        }
        headers
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}
