//! The outbox's last hop to JetStream: [`JetStreamSender`].

use async_nats::header::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::Context;
use idem::outbox::{Message, SendError, SendFuture, Sender};

/// The header JetStream deduplicates published messages on, within the
/// stream's `duplicate_window`.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Sends a run's outbox messages ([`idem::outbox`]) to JetStream: the
/// message's destination is the subject, its id goes in `Nats-Msg-Id`
/// (JetStream drops a second publish of it within the stream's
/// `duplicate_window`) and in `Idempotency-Key` (what an idem consumer
/// downstream keys on, past the window), and a send is confirmed when
/// the stream's ack arrives.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let sender = idem_nats::JetStreamSender::new(async_nats::jetstream::new(client));
/// let idem = idem::Idempotency::builder(idem::MemoryStore::new())
///     .outbox(sender)
///     .build()?;
/// # let _ = idem;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct JetStreamSender {
    js: Context,
}

impl JetStreamSender {
    /// Sends through `js`.
    pub fn new(js: Context) -> Self {
        Self { js }
    }
}

impl Sender for JetStreamSender {
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a> {
        Box::pin(async move {
            let mut headers = HeaderMap::new();
            headers.insert(MSG_ID_HEADER, message.id());
            for (name, value) in message.stamped_headers() {
                headers.append(name, value);
            }
            let ack = self
                .js
                .publish_with_headers(
                    message.destination().to_owned(),
                    headers,
                    message.payload().clone(),
                )
                .await
                .map_err(classify)?;
            ack.await.map_err(classify)?;
            Ok(())
        })
    }
}

/// A publish that may succeed when tried again (no stream answering yet,
/// a timeout, a connection lost) is unavailable; one the server refused
/// as it is (too large, a failed expectation) is refused.
fn classify(error: async_nats::jetstream::context::PublishError) -> SendError {
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence => SendError::Refused(error.into()),
        _ => SendError::Unavailable(error.into()),
    }
}
