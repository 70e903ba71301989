//! [`RabbitConsumer`]: runs the handler over the queue's deliveries.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use idem::{Codec, Store};
use idem_consumer::{Consumer, Job, Stopped};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::broker::Rabbit;
use crate::error::RabbitError;
use crate::message::AmqpMessage;

/// A RabbitMQ queue consumer that runs every delivery through idem.
pub struct RabbitConsumer<S, C> {
    pub(crate) broker: Arc<Rabbit>,
    pub(crate) consumer: Consumer<S, C>,
}

impl<S, C> std::fmt::Debug for RabbitConsumer<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitConsumer")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

impl<S, C> RabbitConsumer<S, C>
where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// The consumer layer, for its [`stats`](Consumer::stats).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.consumer
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.broker.topology.queue
    }

    /// The dead-letter queue, `<queue>.dead`.
    pub fn dead_letter_queue(&self) -> String {
        self.broker.topology.dead()
    }

    /// Every queue of the topology: the queue, its retry queues and its
    /// dead-letter queue.
    pub fn queues(&self) -> Vec<String> {
        let t = &self.broker.topology;
        std::iter::once(t.queue.clone())
            .chain(t.retries.iter().map(|d| t.retry_queue(*d)))
            .chain(std::iter::once(t.dead()))
            .collect()
    }

    /// Consumes until `shutdown` resolves, then stops taking deliveries,
    /// lets the ones in flight finish and settle, and returns. Deliveries
    /// taken but not settled stay with the broker, which redelivers them:
    /// nothing is lost on shutdown or on a crash.
    ///
    /// A channel the broker closes (its `consumer_timeout`) is replaced,
    /// and a lost connection (the broker restarted, the network cut) is
    /// opened again, trying every 100 ms to 5 s until it works; consuming
    /// then goes on. Deliveries the lost channel held are redelivered by
    /// the broker and meet their keys. Returns an error when the broker
    /// ends the consumer (queue deleted); call it again (with a fresh
    /// [`connect`]) to go on.
    ///
    /// [`connect`]: crate::RabbitConsumerBuilder::connect
    pub async fn run<H, Fut, T, E>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RabbitError>
    where
        H: Fn(Job<AmqpMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        if self.broker.running.swap(true, Ordering::SeqCst) {
            return Err(RabbitError::Config(
                "this consumer is already running; connect another to consume in parallel"
                    .to_owned(),
            ));
        }
        let ran = self.consumer.run(&self.broker, handler, shutdown).await;
        self.broker.running.store(false, Ordering::SeqCst);
        match ran? {
            Stopped::Shutdown => Ok(()),
            Stopped::Ended => Err(RabbitError::Ended {
                queue: self.broker.topology.queue.clone(),
            }),
        }
    }
}
