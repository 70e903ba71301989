//! The messages a run has sent so far, held until the run ends.

use parking_lot::Mutex;

use super::{Message, SendError, MAX_MESSAGES_BYTES};

/// What a run's [`Context`](crate::Context) collects: shared by the
/// context's clones, taken once when the run ends.
#[derive(Debug, Default)]
pub(crate) struct Outgoing {
    /// Whether the executor has a sender.
    enabled: bool,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    messages: Vec<Message>,
    bytes: usize,
    /// The run has ended: its messages were taken.
    ended: bool,
}

impl Outgoing {
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            held: Mutex::default(),
        }
    }

    /// Adds `message`, refused if the executor has no outbox, the message
    /// is malformed, or the run's messages would grow past their limit.
    pub(crate) fn push(&self, message: Message) -> Result<(), SendError> {
        if !self.enabled {
            return Err(SendError::NoOutbox);
        }
        message.check()?;
        let size = message.stored_size();
        let mut held = self.held.lock();
        if held.ended {
            return Err(SendError::Ended);
        }
        let total = held.bytes.saturating_add(size);
        if total > MAX_MESSAGES_BYTES {
            return Err(SendError::TooLarge {
                size: total,
                limit: MAX_MESSAGES_BYTES,
            });
        }
        held.bytes = total;
        held.messages.push(message);
        Ok(())
    }

    /// The messages sent, in order, leaving none; later sends are
    /// refused.
    pub(crate) fn take(&self) -> Vec<Message> {
        let mut held = self.held.lock();
        held.ended = true;
        std::mem::take(&mut held.messages)
    }
}
