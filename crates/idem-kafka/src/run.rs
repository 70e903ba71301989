//! A lane's run: records join their chain, are claimed ahead in one round
//! trip, and are settled one at a time per chain.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;

use idem::{ClaimedAhead, Codec, Store};
use idem_consumer::{Disposition, Job};
use rdkafka::consumer::Consumer as _;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::lane;
use crate::lane::{LaneState, Partition};
use crate::message::KafkaMessage;
use crate::order::Chain;
use crate::shared::{Ahead, Shared};

/// One partition's worker: see the `lane` module. Records join a chain
/// (the whole partition, or their record key under
/// [`PartitionOrder::Keys`]); each chain runs one record at a time, in
/// offset order, and the stored offset is the lowest record not yet
/// settled.
pub(crate) async fn lane<S, C, T, E, H, Fut>(
    shared: Arc<Shared<S, C>>,
    partition: Partition,
    state: Arc<LaneState>,
    mut records: mpsc::UnboundedReceiver<KafkaMessage>,
    handler: Arc<H>,
    stop: watch::Receiver<bool>,
) where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: StdError + Send + Sync + 'static,
    H: Fn(Job<KafkaMessage>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    let low_water = shared.max_buffered / 2;
    let window = shared
        .ahead
        .as_ref()
        .map_or(shared.order.window(), |(batch, _)| *batch);
    let mut unsettled: BTreeSet<i64> = BTreeSet::new();
    let mut chains: HashMap<Chain, VecDeque<Queued>> = HashMap::new();
    let mut running: JoinSet<(Chain, i64, bool)> = JoinSet::new();
    let mut taken_up_to = None;
    let mut stored = None;
    let start = |queued: Queued, chain: Chain, running: &mut JoinSet<_>| {
        let (shared, state, handler, stop) = (
            Arc::clone(&shared),
            Arc::clone(&state),
            Arc::clone(&handler),
            stop.clone(),
        );
        running.spawn(async move {
            let offset = queued.record.offset();
            let settled = shared.settle(queued, &*handler, &state, &stop).await;
            (chain, offset, settled)
        });
    };
    let mut ended = false;
    while !ended || !running.is_empty() {
        tokio::select! {
            // A lane revoked while idle ends here rather than waiting for
            // a record that will never come.
            () = state.revoked(), if !ended => ended = true,
            record = records.recv(), if !ended && unsettled.len() < window => {
                let Some(record) = record else {
                    ended = true;
                    continue;
                };
                state.taken(&shared.kafka, &partition, low_water);
                if state.ended(&stop) {
                    ended = true;
                    continue;
                }
                let record = Arc::new(record);
                unsettled.insert(record.offset());
                taken_up_to = Some(record.offset() + 1);
                let chain = shared.order.chain(&record);
                let queue = chains.entry(chain.clone()).or_default();
                queue.push_back(Queued { record, ahead: None });
                if queue.len() == 1 {
                    start(queue[0].take(), chain, &mut running);
                }
            }
            Some(done) = running.join_next(), if !running.is_empty() => {
                let Ok((chain, offset, settled)) = done else {
                    ended = true;
                    continue;
                };
                if !settled {
                    // The lane ended during a retry wait: the record stays
                    // unsettled and uncommitted.
                    ended = true;
                    continue;
                }
                unsettled.remove(&offset);
                if let Some(queue) = chains.get_mut(&chain) {
                    queue.pop_front();
                    if queue.is_empty() || ended {
                        chains.remove(&chain);
                    } else {
                        if let Some((batch, claim)) = &shared.ahead {
                            claim_waiting(queue, *batch, claim).await;
                        }
                        start(queue[0].take(), chain, &mut running);
                    }
                }
                let next = unsettled.first().copied().or(taken_up_to);
                if next > stored && !state.is_revoked() {
                    stored = next;
                    let list = lane::list(&partition, next);
                    if let Err(error) = shared.kafka.store_offsets(&list) {
                        tracing::debug!(%error, topic = %partition.0, partition = partition.1,
                            "offset not stored (partition no longer assigned)");
                    }
                }
            }
        }
    }
}

/// A record waiting in its chain, with the claim made ahead for it.
struct Queued {
    record: Arc<KafkaMessage>,
    ahead: Option<ClaimedAhead>,
}

impl Queued {
    /// The record and its claim, leaving the claim behind empty (the
    /// record stays queued until it is settled).
    fn take(&mut self) -> Queued {
        Queued {
            record: Arc::clone(&self.record),
            ahead: self.ahead.take(),
        }
    }
}

/// Claims, in one round trip, up to `batch` records at the front of
/// `queue` that wait without a claim, when there are at least two (one
/// is claimed as well by its own run).
async fn claim_waiting(queue: &mut VecDeque<Queued>, batch: usize, claim: &Ahead) {
    if queue.front().is_some_and(|q| q.ahead.is_some()) {
        return;
    }
    let waiting: Vec<usize> = (0..queue.len())
        .filter(|&i| queue[i].ahead.is_none())
        .take(batch)
        .collect();
    if waiting.len() < 2 {
        return;
    }
    let records = waiting
        .iter()
        .map(|&i| Arc::clone(&queue[i].record))
        .collect();
    for (i, claimed) in waiting.into_iter().zip(claim(records).await) {
        queue[i].ahead = claimed;
    }
}

impl<S: Store, C: Codec> Shared<S, C> {
    /// Runs `record` until it is acked or dead-lettered (true), retrying
    /// in place; false when the lane ended first.
    async fn settle<T, E, H, Fut>(
        &self,
        queued: Queued,
        handler: &H,
        state: &LaneState,
        stop: &watch::Receiver<bool>,
    ) -> bool
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        H: Fn(Job<KafkaMessage>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let Queued { record, mut ahead } = queued;
        loop {
            let decision = match ahead.take() {
                Some(claimed) => {
                    self.consumer
                        .process_claimed(Arc::clone(&record), claimed, handler)
                        .await
                }
                None => self.consumer.process(Arc::clone(&record), handler).await,
            };
            let after = match decision.disposition {
                Disposition::Ack(_) => return true,
                Disposition::DeadLetter { reason } => {
                    return self
                        .dead_letter(&record, decision.key.as_ref(), &reason, state, stop)
                        .await;
                }
                Disposition::Retry { after, .. } => after,
                other => {
                    tracing::error!(?other, "unknown disposition; retrying the record");
                    self.consumer.max_retry_delay()
                }
            };
            if !state.sleep(after, stop).await {
                return false;
            }
        }
    }
}
