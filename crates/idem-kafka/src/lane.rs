//! One partition's worker (a *lane*) and the rebalance bookkeeping that
//! starts and stops lanes.
//!
//! The dispatcher reads the consumer's one stream and hands each record to
//! the lane of its partition. A lane takes its records in offset order,
//! one at a time: a record to be retried is retried in place, so no later
//! record of the partition passes it, and the lane stores `offset + 1`
//! for auto-commit only once the record is acked or dead-lettered. When
//! the group takes the partition away, the lane is marked revoked: it
//! drops the records it still holds, wakes from any retry wait, and
//! stores nothing more; a handler already running finishes and records
//! its outcome, which the partition's next owner replays.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer as _, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::{watch, Notify};

/// A topic and partition.
pub(crate) type Partition = (String, i32);

/// The rdkafka consumer this crate builds.
pub(crate) type Kafka = StreamConsumer<GroupContext>;

/// One lane's state, shared by the dispatcher, the lane's task and the
/// rebalance callbacks.
#[derive(Debug, Default)]
pub(crate) struct LaneState {
    revoked: AtomicBool,
    wake: Notify,
    queued: AtomicUsize,
    paused: Mutex<bool>,
}

impl LaneState {
    fn revoke(&self) {
        self.revoked.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::SeqCst)
    }

    /// Whether the lane is to stop: revoked, or the consumer is shutting
    /// down.
    pub(crate) fn ended(&self, stop: &watch::Receiver<bool>) -> bool {
        self.is_revoked() || *stop.borrow()
    }

    /// Resolves when the lane is revoked (at once if it already was).
    pub(crate) async fn revoked(&self) {
        let woken = self.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if !self.is_revoked() {
            woken.await;
        }
    }

    /// Sleeps for `delay`; false when the lane ended first.
    pub(crate) async fn sleep(&self, delay: Duration, stop: &watch::Receiver<bool>) -> bool {
        let mut stopping = stop.clone();
        tokio::select! {
            () = tokio::time::sleep(delay) => !self.ended(stop),
            () = self.revoked() => false,
            _ = stopping.wait_for(|stopping| *stopping) => false,
        }
    }

    /// Counts a record handed to the lane, and pauses the partition once
    /// `limit` records wait, so one slow partition holds back only itself.
    pub(crate) fn queued(&self, kafka: &Kafka, partition: &Partition, limit: usize) {
        let waiting = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
        if waiting >= limit {
            let mut paused = lock(&self.paused);
            if !*paused && !self.is_revoked() {
                *paused = kafka.pause(&list(partition, None)).is_ok();
            }
        }
    }

    /// Counts a record taken by the lane, and resumes a paused partition
    /// once at most `low` records wait.
    pub(crate) fn taken(&self, kafka: &Kafka, partition: &Partition, low: usize) {
        let waiting = self.queued.fetch_sub(1, Ordering::SeqCst) - 1;
        if waiting <= low {
            let mut paused = lock(&self.paused);
            if *paused {
                // A partition revoked meanwhile is not ours to resume; the
                // next assignment starts unpaused.
                let _ = kafka.resume(&list(partition, None));
                *paused = false;
            }
        }
    }
}

/// Offset `next` for one partition, or no offset.
pub(crate) fn list(partition: &Partition, next: Option<i64>) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    match next {
        Some(next) => {
            // Only fails for an invalid offset; `next` is a record's + 1.
            let _ = list.add_partition_offset(&partition.0, partition.1, Offset::Offset(next));
        }
        None => {
            list.add_partition(&partition.0, partition.1);
        }
    }
    list
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The consumer's rdkafka context: keeps the lane of every assigned
/// partition, revokes lanes in the rebalance callbacks, and sends
/// librdkafka's log lines to `tracing`.
#[derive(Debug, Default)]
pub(crate) struct GroupContext {
    lanes: Mutex<HashMap<Partition, Arc<LaneState>>>,
}

impl GroupContext {
    /// The lane of an assigned partition; `None` when the partition is
    /// not assigned to this consumer (a record left from before a
    /// rebalance), whose records must not be processed here.
    pub(crate) fn lane(&self, partition: &Partition) -> Option<Arc<LaneState>> {
        lock(&self.lanes).get(partition).cloned()
    }
}

impl ClientContext for GroupContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, reason, "Kafka client error");
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(revoked) = rebalance {
            let mut lanes = lock(&self.lanes);
            for e in revoked.elements() {
                if let Some(lane) = lanes.remove(&(e.topic().to_owned(), e.partition())) {
                    lane.revoke();
                }
            }
            tracing::info!(partitions = revoked.count(), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                let mut lanes = lock(&self.lanes);
                for e in assigned.elements() {
                    lanes
                        .entry((e.topic().to_owned(), e.partition()))
                        .or_default();
                }
                tracing::info!(partitions = assigned.count(), "partitions assigned");
            }
            Rebalance::Error(error) => tracing::warn!(%error, "rebalance failed"),
            Rebalance::Revoke(_) => {}
        }
    }
}

/// A context for the dead-letter producer and the admin client: logs to
/// `tracing`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LogContext;

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, reason, "Kafka client error");
    }
}

fn log(level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", facility, message),
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, message),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", facility, message)
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, message),
    }
}
