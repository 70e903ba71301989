//! A JetStream message as the consumer sees it.

use async_nats::jetstream::message::{AckKind, Acker};
use async_nats::jetstream::{self};
use async_nats::HeaderMap;
use idem_consumer::Message;

/// One JetStream message.
pub struct NatsMessage {
    pub(crate) message: async_nats::Message,
    pub(crate) acker: Acker,
    delivered: u32,
    pub(crate) stream_sequence: u64,
}

impl std::fmt::Debug for NatsMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsMessage")
            .field("subject", &self.message.subject)
            .field("stream_sequence", &self.stream_sequence)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl NatsMessage {
    /// The subject it was published to.
    pub fn subject(&self) -> &str {
        self.message.subject.as_str()
    }

    /// Its headers, if any.
    pub fn headers(&self) -> Option<&HeaderMap> {
        self.message.headers.as_ref()
    }

    /// Its sequence number in the stream.
    pub fn stream_sequence(&self) -> u64 {
        self.stream_sequence
    }
}

impl Message for NatsMessage {
    fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.message.headers.as_ref()?.get(name).map(|v| v.as_str())
    }

    fn message_id(&self) -> Option<&str> {
        self.header("Nats-Msg-Id")
    }

    fn delivery_count(&self) -> Option<u32> {
        Some(self.delivered)
    }

    async fn keep_alive(&self) {
        if let Err(error) = self.acker.ack_with(AckKind::Progress).await {
            tracing::warn!(%error, "in-progress ack failed; JetStream may redeliver after ack_wait");
        }
    }
}

pub(crate) fn split(message: jetstream::Message) -> Result<NatsMessage, async_nats::Error> {
    let (delivered, stream_sequence) = {
        let info = message.info()?;
        (
            u32::try_from(info.delivered).unwrap_or(u32::MAX),
            info.stream_sequence,
        )
    };
    let (message, acker) = message.split();
    Ok(NatsMessage {
        message,
        acker,
        delivered,
        stream_sequence,
    })
}
