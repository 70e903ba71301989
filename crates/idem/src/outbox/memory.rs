//! A [`Sender`] that keeps what it is sent, for tests and examples.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{Message, SendError, SendFuture, Sender};
use crate::store::BoxError;

/// Keeps every message it is sent, in order, and can be told to fail or
/// to hang:
/// for tests and examples, never as the proof that a broker delivers.
#[derive(Debug, Clone, Default)]
pub struct MemorySender {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    sent: Vec<Message>,
    failing: bool,
    hanging: bool,
}

impl MemorySender {
    /// An empty sender that accepts everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every message sent so far (a message sent twice appears twice).
    pub fn messages(&self) -> Vec<Message> {
        self.inner.lock().sent.clone()
    }

    /// From now on, answer every send as a broker that cannot be reached
    /// (`true`), or accept them again (`false`).
    pub fn fail(&self, failing: bool) {
        self.inner.lock().failing = failing;
    }

    /// From now on, never answer a send, as a broker that went silent
    /// (the caller is cut off, or dies, while it waits; nothing is kept),
    /// or answer again (`false`).
    pub fn hang(&self, hanging: bool) {
        self.inner.lock().hanging = hanging;
    }
}

impl Sender for MemorySender {
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a> {
        let mut inner = self.inner.lock();
        if inner.hanging {
            return Box::pin(std::future::pending());
        }
        let result = if inner.failing {
            Err(SendError::Unavailable(BoxError::from(
                "the memory sender is failing",
            )))
        } else {
            inner.sent.push(message.clone());
            Ok(())
        };
        Box::pin(std::future::ready(result))
    }
}
