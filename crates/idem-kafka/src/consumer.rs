//! [`KafkaConsumer`]: one stream read by a dispatcher that hands each
//! record to its partition's lane.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idem::{Codec, Store};
use idem_consumer::{Consumer, Job, Stopped};
use rdkafka::consumer::{CommitMode, Consumer as _};
use rdkafka::error::{KafkaError as RdKafkaError, RDKafkaErrorCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::error::KafkaConsumerError;
use crate::lane::{LaneState, Partition};
use crate::message::KafkaMessage;
use crate::run::lane;

pub(crate) use crate::shared::{Ahead, Shared};

/// How long the dispatcher waits after the stream reports an error.
const STREAM_BACKOFF: Duration = Duration::from_millis(200);

/// A Kafka consumer-group member that gives each record's effect exactly
/// once: see the [crate documentation](crate).
pub struct KafkaConsumer<S, C> {
    pub(crate) shared: Arc<Shared<S, C>>,
}

impl<S, C> std::fmt::Debug for KafkaConsumer<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConsumer")
            .field("consumer", &self.shared.consumer)
            .field("order", &self.shared.order)
            .finish_non_exhaustive()
    }
}

/// A lane as the dispatcher holds it.
struct LaneHandle {
    state: Arc<LaneState>,
    records: mpsc::UnboundedSender<KafkaMessage>,
}

impl<S: Store, C: Codec> KafkaConsumer<S, C> {
    /// The consumer layer (for its [`stats`](Consumer::stats)).
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.shared.consumer
    }

    /// The dead-letter topic of `topic`.
    pub fn dead_letter_topic(&self, topic: &str) -> Option<&str> {
        self.shared.dead_letters.get(topic).map(String::as_str)
    }

    /// Consumes until `shutdown` resolves (or the stream ends). Then it
    /// takes no more records, lets every running handler finish and store
    /// its offset, commits, and leaves the group; records it held but had
    /// not started are delivered again to the group.
    pub async fn run<T, E, H, Fut>(
        self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Stopped, KafkaConsumerError>
    where
        S: Send + Sync + 'static,
        C: Send + Sync + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
        H: Fn(Job<KafkaMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let (stop, stopping) = watch::channel(false);
        let mut lanes: HashMap<Partition, LaneHandle> = HashMap::new();
        let mut workers = JoinSet::new();
        let shared = Arc::clone(&self.shared);
        let mut records = shared.kafka.stream();
        tokio::pin!(shutdown);
        let stopped = loop {
            tokio::select! {
                () = &mut shutdown => break Stopped::Shutdown,
                Some(_) = workers.join_next(), if !workers.is_empty() => {}
                next = records.next() => match next {
                    None => break Stopped::Ended,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "Kafka consumer error");
                        tokio::time::sleep(STREAM_BACKOFF).await;
                    }
                    Some(Ok(record)) => {
                        let record = KafkaMessage::new(record.detach());
                        let partition = (record.topic().to_owned(), record.partition());
                        let Some(state) = shared.kafka.context().lane(&partition) else {
                            // Left over from before a rebalance: not ours.
                            continue;
                        };
                        let current = lanes
                            .get(&partition)
                            .is_some_and(|h| Arc::ptr_eq(&h.state, &state));
                        if !current {
                            let (tx, rx) = mpsc::unbounded_channel();
                            workers.spawn(lane(
                                Arc::clone(&shared),
                                partition.clone(),
                                Arc::clone(&state),
                                rx,
                                Arc::clone(&handler),
                                stopping.clone(),
                            ));
                            lanes.insert(partition.clone(), LaneHandle { state, records: tx });
                        }
                        let handle = &lanes[&partition];
                        handle.state.queued(&shared.kafka, &partition, shared.max_buffered);
                        // A lane that ended has dropped its receiver; the
                        // record is delivered again to the partition's
                        // owner.
                        let _ = handle.records.send(record);
                    }
                },
            }
        };
        drop(records);
        let _ = stop.send(true);
        drop(lanes);
        while workers.join_next().await.is_some() {}
        let kafka = Arc::clone(&self.shared.kafka);
        match blocking(move || kafka.commit_consumer_state(CommitMode::Sync)).await {
            Ok(()) | Err(RdKafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => tracing::warn!(%error, "final commit failed; the group redelivers \
                 (and replays) the records after the last commit"),
        }
        self.shared.kafka.unsubscribe();
        Ok(stopped)
    }
}

/// Runs a blocking librdkafka call off the async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, RdKafkaError> + Send + 'static,
) -> Result<T, RdKafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or(Err(RdKafkaError::Canceled))
}
