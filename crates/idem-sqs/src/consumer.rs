//! [`SqsConsumer`]: runs the handler over the queue's messages.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;

use idem::{Codec, Store};
use idem_consumer::{Consumer, Job, Stopped};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::broker::Sqs;
use crate::error::SqsError;
use crate::message::SqsMessage;

/// An SQS consumer that runs every message through idem.
pub struct SqsConsumer<S, C> {
    pub(crate) broker: Arc<Sqs>,
    pub(crate) consumer: Consumer<S, C>,
}

impl<S, C> std::fmt::Debug for SqsConsumer<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsConsumer")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

impl<S, C> SqsConsumer<S, C>
where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// The consumer layer, for its [`stats`](Consumer::stats).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.consumer
    }

    /// The queue dead-letter copies are sent to.
    pub fn dead_letter_queue(&self) -> &str {
        &self.broker.dead_letter_url
    }

    /// Consumes until `shutdown` resolves, then takes no more messages,
    /// lets those in flight finish and settle, and returns. Messages
    /// received but not yet handed to a handler stay invisible until their
    /// visibility timeout runs out and are delivered again: nothing is
    /// lost.
    pub async fn run<H, Fut, T, E>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), SqsError>
    where
        H: Fn(Job<SqsMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        match self.consumer.run(&self.broker, handler, shutdown).await? {
            Stopped::Shutdown => Ok(()),
            Stopped::Ended => Err(SqsError::Consume {
                queue: self.broker.queue.url.clone(),
                reason: "the message stream ended".to_owned(),
            }),
        }
    }
}
