//! [`NatsConsumer`]: runs the handler over the stream's messages.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;

use idem::{Codec, Store};
use idem_consumer::{Consumer, Job, Stopped};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::broker::JetStream;
use crate::error::NatsError;
use crate::message::NatsMessage;

/// A JetStream pull consumer that runs every message through idem.
pub struct NatsConsumer<S, C> {
    pub(crate) broker: Arc<JetStream>,
    pub(crate) consumer: Consumer<S, C>,
}

impl<S, C> std::fmt::Debug for NatsConsumer<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConsumer")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

impl<S, C> NatsConsumer<S, C>
where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// The consumer layer, for its [`stats`](Consumer::stats).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.consumer
    }

    /// The subject dead-letter copies are published to.
    pub fn dead_letter_subject(&self) -> &str {
        &self.broker.dead_subject
    }

    /// Consumes until `shutdown` resolves, then takes no more messages,
    /// lets those in flight finish and settle, and returns. Messages
    /// fetched but not yet handed to a handler are left unacknowledged and
    /// redelivered after `ack_wait`: nothing is lost.
    pub async fn run<H, Fut, T, E>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), NatsError>
    where
        H: Fn(Job<NatsMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        match self.consumer.run(&self.broker, handler, shutdown).await? {
            Stopped::Shutdown => Ok(()),
            Stopped::Ended => Err(self.broker.consume_error("the message stream ended")),
        }
    }
}
