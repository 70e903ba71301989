//! Batch events in, partial batch failures out: each record claimed and
//! run through the consumer layer, within the invocation's time.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use futures_util::StreamExt as _;
use idem::{Codec, Store};
use idem_consumer::{Consumer, Decision, Disposition, Job, RetryCause};
use lambda_runtime::{service_fn, LambdaEvent};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::deadline::{self, DEFAULT_MARGIN};
use crate::record::Record;

/// A Lambda event that carries a batch of records.
pub trait BatchEvent: DeserializeOwned + Send {
    /// The records, in the order Lambda gave them.
    fn into_records(self) -> Vec<Record>;
}

impl BatchEvent for SqsEvent {
    fn into_records(self) -> Vec<Record> {
        self.records
            .into_iter()
            .map(|message| {
                let fifo = message
                    .event_source_arn
                    .as_deref()
                    .is_some_and(|arn| arn.ends_with(".fifo"));
                Record::from_sqs(message, fifo)
            })
            .collect()
    }
}

impl BatchEvent for KinesisEvent {
    fn into_records(self) -> Vec<Record> {
        self.records.into_iter().map(Record::from_kinesis).collect()
    }
}

impl BatchEvent for DynamoDbEvent {
    fn into_records(self) -> Vec<Record> {
        self.records
            .into_iter()
            .map(Record::from_dynamodb)
            .collect()
    }
}

/// The answer that tells Lambda which records to deliver again (its
/// *partial batch response*, the same for SQS, Kinesis and DynamoDB
/// Streams; the event source mapping needs `ReportBatchItemFailures`).
/// Every record not named is done: Lambda deletes it or moves past it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchResponse {
    /// The records to deliver again.
    pub batch_item_failures: Vec<ItemFailure>,
}

/// A record to deliver again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemFailure {
    /// Its [`Record::item_id`].
    pub item_identifier: String,
}

/// Why a whole batch is failed (Lambda then delivers all of it again).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// A record to deliver again has no id to name it by.
    #[error(
        "record {index} of the batch is to be delivered again but has no id to report it by; \
         failing the whole batch"
    )]
    NoItemId {
        /// Its place in the batch.
        index: usize,
    },
}

impl From<BatchError> for lambda_runtime::Diagnostic {
    fn from(error: BatchError) -> Self {
        Self {
            error_type: "Idem.BatchError".to_owned(),
            error_message: error.to_string(),
        }
    }
}

/// The handler of SQS, Kinesis and DynamoDB Streams batches: each record
/// goes through [`Consumer::process`] (its key, the claim, the handler,
/// the stored outcome), and the records whose disposition is not an ack
/// are reported in [`BatchResponse`] for Lambda to deliver again:
///
/// | disposition | in the response | what Lambda does |
/// |---|---|---|
/// | ack (executed, replayed) | not named | deletes it, or moves past it |
/// | retry (in progress elsewhere, a retryable failure, out of time, store down) | named | delivers it again |
/// | dead-letter (terminal failure, no usable key, key reused with another payload) | named, with the reason logged | delivers it again; the stored failure is replayed, never run again, until the queue's redrive policy or the mapping's retry limit and on-failure destination take it |
///
/// A record of an ordered source (an SQS FIFO queue, a Kinesis or
/// DynamoDB stream) that is not acked stops the batch: it and every record
/// after it are named, unstarted, so nothing overtakes it.
///
/// **Time.** Every run stops [`margin`](Self::margin) before the
/// invocation's deadline: the handler is dropped, its claim released
/// with a retryable failure
/// ([`Interrupted::OutOfTime`](crate::Interrupted::OutOfTime)) and its
/// record named, so its redelivery runs instead of meeting a claim
/// Lambda's kill would have left until its lease ran out. A record is
/// started only with [`min_time_to_start`](Self::min_time_to_start) left
/// before that stop; the rest are named without a claim. On an ordered
/// source, a record whose key a run elsewhere still holds is waited for
/// while time is left.
pub struct BatchHandler<S, C, H> {
    consumer: Consumer<S, C>,
    handler: H,
    margin: Duration,
    min_to_start: Duration,
    concurrency: usize,
}

impl<S, C, H> std::fmt::Debug for BatchHandler<S, C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchHandler")
            .field("consumer", &self.consumer)
            .field("margin", &self.margin)
            .field("min_to_start", &self.min_to_start)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl<S: Store, C: Codec, H> BatchHandler<S, C, H> {
    /// Runs each record with `handler`, through `consumer`, one at a time.
    pub fn new<Fut>(consumer: Consumer<S, C>, handler: H) -> Self
    where
        H: Fn(Job<Record>) -> Fut,
    {
        Self {
            consumer,
            handler,
            margin: DEFAULT_MARGIN,
            min_to_start: DEFAULT_MARGIN,
            concurrency: 1,
        }
    }

    /// How long before the invocation's deadline runs are stopped
    /// (default [`DEFAULT_MARGIN`]): enough to release a claim in the
    /// store and answer Lambda.
    #[must_use]
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// The least time a record must have before the stop (the deadline
    /// less the [`margin`](Self::margin)) to be started (default
    /// [`DEFAULT_MARGIN`]): one started later would cost a claim, an
    /// attempt and a release for nothing. Set it to how long the handler
    /// usually takes.
    #[must_use]
    pub fn min_time_to_start(mut self, least: Duration) -> Self {
        self.min_to_start = least;
        self
    }

    /// How many records of a standard SQS queue run at once (default 1;
    /// ordered sources always run one at a time). Records of one batch
    /// with the same key then meet each other's claim, and the later one
    /// is delivered again and replayed.
    #[must_use]
    pub fn concurrency(mut self, records: usize) -> Self {
        self.concurrency = records.max(1);
        self
    }

    /// The consumer the records go through.
    pub fn consumer(&self) -> &Consumer<S, C> {
        &self.consumer
    }
}

impl<S, C, H, Fut, T, E> BatchHandler<S, C, H>
where
    S: Store,
    C: Codec,
    H: Fn(Job<Record>) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: StdError + Send + Sync + 'static,
{
    /// Handles one invocation's batch.
    pub async fn handle<Ev: BatchEvent>(
        &self,
        event: LambdaEvent<Ev>,
    ) -> Result<BatchResponse, BatchError> {
        let stop = deadline::stop_at(&event.context, self.margin);
        let records: Vec<Arc<Record>> = event
            .payload
            .into_records()
            .into_iter()
            .map(Arc::new)
            .collect();
        let ordered = records.first().is_some_and(|r| r.source().ordered());
        let done = if ordered {
            self.in_order(&records, stop).await
        } else {
            futures_util::stream::iter(records.iter().cloned())
                .map(|record| async { matches!(self.one(record, stop).await, Settled::Done) })
                .buffered(self.concurrency)
                .collect()
                .await
        };
        let mut response = BatchResponse::default();
        for (index, (record, acked)) in records.iter().zip(done).enumerate() {
            if !acked {
                let id = record.item_id().ok_or(BatchError::NoItemId { index })?;
                response.batch_item_failures.push(ItemFailure {
                    item_identifier: id.to_owned(),
                });
            }
        }
        Ok(response)
    }

    /// Runs this handler as the function: polls the Runtime API for
    /// batches of `Ev` (`SqsEvent`, `KinesisEvent`, the DynamoDB
    /// `Event`) and answers each with its [`BatchResponse`].
    pub async fn run<Ev: BatchEvent>(self) -> Result<(), lambda_runtime::Error> {
        let handler = &self;
        lambda_runtime::run(service_fn(move |event: LambdaEvent<Ev>| async move {
            handler.handle(event).await
        }))
        .await
    }

    /// The records of an ordered source, one after another until the
    /// first that is not acked; that one and the rest are not. A record
    /// whose key is held by a run elsewhere (one Lambda killed at its
    /// timeout, say) is waited for while time is left, since naming it
    /// would have Lambda retry the shard at once and spend its retry
    /// attempts on a claim that is still alive.
    async fn in_order(&self, records: &[Arc<Record>], stop: Instant) -> Vec<bool> {
        let mut done = Vec::with_capacity(records.len());
        'records: for record in records {
            loop {
                match self.one(Arc::clone(record), stop).await {
                    Settled::Done => break,
                    Settled::HeldElsewhere(after) if Instant::now() < stop => {
                        tokio::time::sleep_until((Instant::now() + after).min(stop)).await;
                    }
                    Settled::HeldElsewhere(_) | Settled::Again => break 'records,
                }
            }
            done.push(true);
        }
        done.resize(records.len(), false);
        done
    }

    /// Whether `record` is done with.
    async fn one(&self, record: Arc<Record>, stop: Instant) -> Settled {
        if Instant::now() + self.min_to_start >= stop {
            tracing::debug!(
                consumer = self.consumer.name(),
                item = record.item_id(),
                "not started: too close to the invocation's deadline"
            );
            return Settled::Again;
        }
        let margin = self.margin;
        let item = record.item_id().map(str::to_owned);
        let decision = self
            .consumer
            .process(record, |job| {
                deadline::within(stop, margin, (self.handler)(job))
            })
            .await;
        settled(self.consumer.name(), item.as_deref(), decision)
    }
}

/// What became of a record.
enum Settled {
    /// Acked: Lambda may forget it.
    Done,
    /// Its key is claimed by a run elsewhere, whose lease ends in about
    /// this long.
    HeldElsewhere(Duration),
    /// To be delivered again.
    Again,
}

/// What a decision means for the batch response; says why a record is to
/// be delivered again in the log.
fn settled(consumer: &str, item: Option<&str>, decision: Decision) -> Settled {
    match decision.disposition {
        Disposition::Ack(_) => Settled::Done,
        Disposition::Retry {
            cause: RetryCause::InProgress,
            after,
        } => Settled::HeldElsewhere(after),
        Disposition::Retry { cause, .. } => {
            tracing::debug!(consumer, item, %cause, "record to be delivered again");
            Settled::Again
        }
        Disposition::DeadLetter { reason } => {
            tracing::warn!(
                consumer,
                item,
                key = decision.key.as_ref().map(|k| k.as_str()),
                %reason,
                "record failed for good; left to the queue's redrive policy or the mapping's \
                 on-failure destination"
            );
            Settled::Again
        }
        _ => Settled::Again,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use futures_util::future::BoxFuture;
    use futures_util::FutureExt as _;
    use idem::{Idempotency, MemoryStore, Scope};
    use idem_consumer::KeyExtractor;
    use serde_json::json;

    use super::*;

    type Work = BoxFuture<'static, Result<u8, idem::Terminal>>;

    fn handler(
        concurrency: usize,
    ) -> BatchHandler<MemoryStore, idem::Json, impl Fn(Job<Record>) -> Work> {
        let idem = Idempotency::builder(MemoryStore::new())
            .build()
            .expect("executor");
        let consumer = Consumer::builder(idem, Scope::new("t").expect("scope"))
            .keys(KeyExtractor::json_pointer("/id"))
            .build();
        BatchHandler::new(consumer, |job: Job<Record>| {
            let bad = job.payload() == b"{\"id\":\"bad\"}";
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if bad {
                    Err(idem::Terminal::new("bad"))
                } else {
                    Ok(1)
                }
            }
            .boxed()
        })
        .concurrency(concurrency)
    }

    fn event(records: &[(Option<&str>, &str)], left: Duration) -> LambdaEvent<SqsEvent> {
        let records: Vec<_> = records
            .iter()
            .map(|(message_id, id)| {
                json!({"messageId": message_id, "body": json!({"id": id}).to_string()})
            })
            .collect();
        let payload = serde_json::from_value(json!({ "Records": records })).expect("event");
        let mut context = lambda_runtime::Context::default();
        let deadline = SystemTime::now() + left;
        context.deadline = deadline
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        LambdaEvent::new(payload, context)
    }

    fn named(response: &BatchResponse) -> Vec<&str> {
        response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect()
    }

    #[tokio::test]
    async fn concurrent_duplicates_in_a_batch_meet_the_claim_and_are_delivered_again() {
        let batch = [(Some("m1"), "a"), (Some("m2"), "a"), (Some("m3"), "b")];
        let response = handler(3)
            .handle(event(&batch, Duration::from_secs(5)))
            .await
            .expect("response");
        assert_eq!(named(&response), ["m2"]);
    }

    #[tokio::test]
    async fn with_no_time_left_nothing_starts_and_everything_is_named() {
        let batch = [(Some("m1"), "a"), (Some("m2"), "b")];
        let h = handler(1);
        let response = h
            .handle(event(&batch, Duration::from_millis(100)))
            .await
            .expect("response");
        assert_eq!(named(&response), ["m1", "m2"]);
        assert_eq!(h.consumer().stats().executed, 0);
    }

    #[tokio::test]
    async fn a_record_to_name_without_an_id_fails_the_whole_batch() {
        let batch = [(Some("m1"), "a"), (None, "bad")];
        let error = handler(1)
            .handle(event(&batch, Duration::from_secs(5)))
            .await
            .expect_err("no id to name it by");
        assert!(
            matches!(error, BatchError::NoItemId { index: 1 }),
            "{error}"
        );
        let diagnostic = lambda_runtime::Diagnostic::from(error);
        assert_eq!(diagnostic.error_type, "Idem.BatchError");
    }
}
