//! The stream as `idem-consumer` drives it: messages pulled in,
//! settlements (ack, nak with a delay, term with a dead-letter copy) out.

use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::message::AckKind;
use async_nats::jetstream::Context;
use futures_util::future::ready;
use futures_util::StreamExt;
use idem_consumer::{Broker, DeadLetter, Deliveries, SettleError};

use crate::error::NatsError;
use crate::message::{split, NatsMessage};

/// Header with the subject a dead-lettered message was published to.
pub const SUBJECT_HEADER: &str = "Idem-Subject";

/// Header with the stream sequence of a dead-lettered message.
pub const SEQUENCE_HEADER: &str = "Idem-Stream-Sequence";

/// The JetStream side of the consume loop.
pub(crate) struct JetStream {
    pub(crate) js: Context,
    pub(crate) pull: PullConsumer,
    pub(crate) durable: String,
    pub(crate) dead_subject: String,
    pub(crate) concurrency: usize,
}

impl JetStream {
    pub(crate) fn consume_error(&self, reason: impl Into<String>) -> NatsError {
        NatsError::Consume {
            consumer: self.durable.clone(),
            reason: reason.into(),
        }
    }
}

impl Broker for JetStream {
    type Message = NatsMessage;
    type Error = NatsError;

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    async fn deliveries(&self) -> Result<Deliveries<NatsMessage, NatsError>, NatsError> {
        let messages = self
            .pull
            .stream()
            .max_messages_per_batch(self.concurrency)
            .messages()
            .await
            .map_err(|e| self.consume_error(e.to_string()))?;
        // Pull errors (missed heartbeats and the like) are recovered by
        // the client itself, and a message that is not a JetStream one
        // cannot be acked: both are logged and skipped.
        Ok(Box::pin(messages.filter_map(|next| {
            ready(
                match next.map_err(async_nats::Error::from).and_then(split) {
                    Ok(message) => Some(Ok(message)),
                    Err(error) => {
                        tracing::warn!(%error, "JetStream pull error; skipped");
                        None
                    }
                },
            )
        })))
    }

    async fn ack(&self, message: &NatsMessage) -> Result<(), SettleError> {
        message.acker.ack_with(AckKind::Ack).await
    }

    async fn retry(&self, message: &NatsMessage, after: Duration) -> Result<(), SettleError> {
        message.acker.ack_with(AckKind::Nak(Some(after))).await
    }

    async fn dead_letter(
        &self,
        message: &NatsMessage,
        letter: &DeadLetter<'_>,
    ) -> Result<(), SettleError> {
        let mut headers = message.message.headers.clone().unwrap_or_default();
        for (name, value) in letter.headers() {
            headers.insert(name, value.as_str());
        }
        headers.insert(SUBJECT_HEADER, message.subject());
        headers.insert(
            SEQUENCE_HEADER,
            message.stream_sequence.to_string().as_str(),
        );
        self.js
            .publish_with_headers(
                self.dead_subject.clone(),
                headers,
                message.message.payload.clone(),
            )
            .await?
            .await?;
        Ok(())
    }

    /// `+TERM`: JetStream stops redelivering the original.
    async fn end_dead_lettered(&self, message: &NatsMessage) -> Result<(), SettleError> {
        message.acker.ack_with(AckKind::Term).await
    }
}
