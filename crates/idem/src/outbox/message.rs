//! A message a run sends, and what sends it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use crate::key::Key;
use crate::store::BoxError;

/// The header a message's id travels in, stamped by every sender
/// ([`Message::stamped_headers`]): what idem's consumers and HTTP layer
/// read a key from by default, so the receiver deduplicates on the
/// producer's key.
pub const KEY_HEADER: &str = "Idempotency-Key";

/// The most a run's messages may take together, encoded (64 MiB): they
/// are stored in the run's record, under its store's and the executor's
/// limits as well.
pub const MAX_MESSAGES_BYTES: usize = 64 << 20;

/// A message a run sends: a destination (a subject, queue, topic or URL,
/// as the [`Sender`] understands it), a payload, headers, and an id.
///
/// The id is a UUIDv7 minted when the message is made ([`crate::key::new_v7`])
/// and stored with it, so every dispatch of the message — a re-dispatch
/// after a lost confirmation included — carries the same id. Senders pass
/// it as the broker's deduplication id and as the `Idempotency-Key` the
/// consumer downstream claims with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub(super) id: String,
    pub(super) destination: String,
    pub(super) payload: Bytes,
    pub(super) headers: Vec<(String, String)>,
}

impl Message {
    /// A message for `destination` with a new UUIDv7 id.
    pub fn new(destination: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            id: crate::key::new_v7().as_str().to_owned(),
            destination: destination.into(),
            payload: payload.into(),
            headers: Vec::new(),
        }
    }

    /// The same message under the producer's own `id` (a key it derived
    /// from the business operation, say): what the receiver deduplicates
    /// on, so two runs that send the same id send one message in effect.
    pub fn with_id(mut self, id: Key) -> Self {
        self.id = id.as_str().to_owned();
        self
    }

    /// The same message with a header added (sent as the broker's header
    /// or property; names and values as the broker allows them).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The message's id: the deduplication id and the receiver's key.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where it goes, as the [`Sender`] understands it.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The headers, in the order they were added.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The headers to send: the message's own, then [`KEY_HEADER`] with
    /// its id unless the message set that header itself.
    pub fn stamped_headers(&self) -> impl Iterator<Item = (&str, &str)> {
        let own = !self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(KEY_HEADER));
        self.headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .chain(own.then_some((KEY_HEADER, self.id.as_str())))
    }

    /// The bytes the message takes as a run stores it, counted against
    /// [`MAX_MESSAGES_BYTES`].
    pub fn stored_size(&self) -> usize {
        16 + self.id.len()
            + self.destination.len()
            + self.payload.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| 6 + n.len() + v.len())
                .sum::<usize>()
    }

    /// Refuses what no sender could deliver (what
    /// [`Context::send`](crate::Context::send) refuses).
    pub fn check(&self) -> Result<(), SendError> {
        if self.destination.is_empty() {
            return Err(SendError::Invalid("the destination is empty".to_owned()));
        }
        for (what, text) in [("destination", &self.destination)]
            .into_iter()
            .chain(self.headers.iter().map(|(n, _)| ("header name", n)))
        {
            if let Some(c) = text.chars().find(|c| c.is_control()) {
                return Err(SendError::Invalid(format!(
                    "{what} {text:?} holds the control character {c:?}"
                )));
            }
        }
        if self.headers.iter().any(|(n, _)| n.is_empty()) {
            return Err(SendError::Invalid("a header name is empty".to_owned()));
        }
        let longest = [&self.id, &self.destination]
            .into_iter()
            .chain(self.headers.iter().map(|(n, _)| n))
            .map(String::len)
            .max()
            .unwrap_or(0);
        if longest > usize::from(u16::MAX) || self.headers.len() > usize::from(u16::MAX) {
            return Err(SendError::Invalid(format!(
                "ids, destinations and header names take at most {} bytes, and a message at most as many headers",
                u16::MAX
            )));
        }
        Ok(())
    }
}

/// Why a message could not be sent, or could not be accepted for sending.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The executor has no outbox: give its builder one with
    /// [`outbox`](crate::IdempotencyBuilder::outbox).
    #[error("this executor has no outbox: give its builder a sender with `outbox(...)`")]
    NoOutbox,
    /// The run has ended (a task the handler spawned sends after it
    /// returned): its messages were already stored.
    #[error("the run has ended: a message must be sent before the handler returns")]
    Ended,
    /// The message cannot be sent as it is (an empty destination, a
    /// control character in a header name).
    #[error("invalid message: {0}")]
    Invalid(String),
    /// The run's messages would take more than they may.
    #[error("the run's messages take {size} bytes, more than the {limit} bytes allowed")]
    TooLarge {
        /// Their encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The broker could not be reached or did not confirm in time: the
    /// message may or may not have arrived, and is sent again (same id).
    #[error("broker unavailable: {0}")]
    Unavailable(#[source] BoxError),
    /// The broker answered and refused the message (too large for it, an
    /// unknown destination): sending again as it is will not help. The
    /// message stays pending, counted and logged, for an operator.
    #[error("broker refused the message: {0}")]
    Refused(#[source] BoxError),
}

impl SendError {
    /// A short name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            SendError::NoOutbox => "no_outbox",
            SendError::Ended => "ended",
            SendError::Invalid(_) => "invalid",
            SendError::TooLarge { .. } => "too_large",
            SendError::Unavailable(_) => "unavailable",
            SendError::Refused(_) => "refused",
        }
    }
}

/// The future a [`Sender`] returns.
pub type SendFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SendError>> + Send + 'a>>;

/// Sends a run's messages to a broker: the outbox's last hop.
///
/// `send` resolves `Ok` only once the broker has taken the message for
/// good (a publisher confirm, a JetStream ack, a Kafka acknowledgement
/// from all in-sync replicas): only then is it counted as sent. It should
/// pass [`Message::id`] as the broker's deduplication id where it has one.
/// It may be called again for a message it already sent (a confirmation
/// lost, a process killed before it was recorded), always with the same
/// id.
pub trait Sender: Send + Sync + 'static {
    /// Sends one message; `Ok` once the broker confirmed it.
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a>;
}

impl<T: Sender + ?Sized> Sender for Arc<T> {
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a> {
        (**self).send(message)
    }
}
