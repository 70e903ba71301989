//! The executor's side of the outbox: the marker held across a sending
//! run's completion, the dispatch that follows it, and the re-dispatch a
//! replay makes when an earlier one was never confirmed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::{marker_id, registry_id, stored_messages, Message, SendError, Sender};
use crate::codec::{plain, Codec};
use crate::executor::Idempotency;
use crate::key::{RecordId, Scope};
use crate::metrics as m;
use crate::record::{ClaimOutcome, ClaimParams, Lease, Record, State};
use crate::store::{DynPendingSends, Store, StoreError};

/// How long a process trusts that a scope's entry in the registry is
/// there before it checks again.
const REGISTERED_FOR: Duration = Duration::from_secs(3600);
/// The shortest time a scope's entry is kept (longer when records are).
const REGISTRY_RETENTION: Duration = Duration::from_secs(30 * 86_400);
/// How long a run waits for a marker someone else holds (a dispatcher
/// looking at it) before completing without holding it.
const MARKER_WAIT: Duration = Duration::from_secs(2);
/// Sends of one message before a dispatch gives up and leaves it pending.
const SEND_TRIES: u32 = 3;

/// Who sends a run's messages once they are stored with its completion.
#[derive(Clone)]
pub(crate) enum SentBy {
    /// This executor, through its sender (and its dispatcher).
    Here(Arc<dyn Sender>),
    /// A dispatcher elsewhere over the same store (`idem outbox run`):
    /// this executor stores the messages and holds their marker only.
    Elsewhere,
    /// The store itself: it takes the messages with the completion and
    /// keeps and sends them on its side (`idem serve`, over the remote
    /// store); this executor holds no marker.
    Store,
}

/// An executor's outbox: who sends, and the scopes it knows are
/// registered.
pub(crate) struct OutboxConfig {
    pub(crate) sent_by: SentBy,
    registered: Mutex<HashMap<Scope, std::time::Instant>>,
}

impl OutboxConfig {
    pub(crate) fn new(sent_by: SentBy) -> Self {
        Self {
            sent_by,
            registered: Mutex::default(),
        }
    }

    /// The sender, when this executor sends.
    fn sender(&self) -> Option<&Arc<dyn Sender>> {
        match &self.sent_by {
            SentBy::Here(sender) => Some(sender),
            SentBy::Elsewhere | SentBy::Store => None,
        }
    }
}

/// The marker a completion that carries messages holds until they are
/// confirmed sent: see [`Idempotency::hold_outbox_marker`].
#[derive(Debug)]
#[must_use = "hand it to dispatch_held once the completion is stored"]
pub struct HeldMarker {
    lease: Option<Lease>,
    /// When it was claimed: before the completion was sent.
    since: Instant,
}

/// Why a dispatch stopped: the first send that failed.
pub(crate) type Dispatched = Result<usize, SendError>;

impl<S: Store, C: Codec> Idempotency<S, C> {
    /// The sender, when this executor sends its runs' messages itself.
    fn sender(&self) -> Option<&Arc<dyn Sender>> {
        self.outbox_config().and_then(OutboxConfig::sender)
    }

    /// What markers are claimed with: the executor's lease, and its
    /// retention, so a marker lives as long as its run's record
    /// (plus a lease, as it is claimed just before the run completes).
    pub(crate) fn marker_params(&self) -> ClaimParams {
        let keep = self.retention().saturating_add(self.lease());
        ClaimParams::new(self.lease(), keep)
    }

    /// Before a run that sent messages is completed: makes sure its scope
    /// is registered and claims its marker, so that whatever happens after
    /// the completion the dispatcher finds the messages. The marker holds
    /// its lease if this run could claim it; not if another holds it (it
    /// is pending all the same) or it could not be written (the messages
    /// are stored all the same; a replay dispatches them).
    ///
    /// [`run`](Self::run) calls it; so does a server completing runs its
    /// callers hold (`idem serve`'s claim API, whose callers' messages
    /// come with the completion): store the completion with the messages
    /// sealed in ([`AtRest::seal_run`](crate::codec::AtRest::seal_run),
    /// with [`encode_messages`](super::encode_messages)), then hand the
    /// marker to [`dispatch_held`](Self::dispatch_held).
    pub async fn hold_outbox_marker(&self, run: &RecordId) -> HeldMarker {
        let since = Instant::now();
        HeldMarker {
            lease: self.claim_marker(run).await,
            since,
        }
    }

    /// [`hold_outbox_marker`](Self::hold_outbox_marker)'s claim.
    async fn claim_marker(&self, run: &RecordId) -> Option<Lease> {
        self.register(run.scope()).await;
        let marker = marker_id(run);
        let params = self.marker_params();
        let give_up = Instant::now() + MARKER_WAIT;
        let mut delay = Duration::from_millis(10);
        loop {
            match m::timed(m::OP_CLAIM, self.store().claim(&marker, &params)).await {
                Ok(ClaimOutcome::Acquired(lease)) => return Some(lease),
                Ok(ClaimOutcome::InProgress { .. }) if Instant::now() < give_up => {}
                Err(StoreError::Unavailable(_)) if Instant::now() < give_up => {}
                Ok(ClaimOutcome::InProgress { .. }) => return None,
                // Confirmed already: a holder that lost its run's lease
                // finishing late, or a completion sent again.
                Ok(ClaimOutcome::Completed(_)) => return None,
                other => {
                    tracing::warn!(outcome = ?other.map(|o| o.label()), "the outbox marker could not be claimed; a replay or the dispatcher sends the messages");
                    return None;
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    /// The store's pending index, when a run that sent `messages` is
    /// marked pending by its completion rather than holding a marker: the
    /// run sent some, this executor holds markers at all, and the store
    /// keeps such an index. Makes sure the run's scope is registered
    /// first, as a marker's claim does.
    pub(crate) async fn pending_index(
        &self,
        run: &RecordId,
        messages: &[Message],
    ) -> Option<Arc<dyn DynPendingSends>> {
        if messages.is_empty() || !self.holds_markers() {
            return None;
        }
        let index = self.store().pending_sends()?;
        self.register(run.scope()).await;
        Some(index)
    }

    /// After a run marked pending by its completion (under `fence`) was
    /// stored: dispatches its messages and, once all are confirmed,
    /// clears the mark — in the background on a networked store, so the
    /// run's answer (and the input's ack behind it) does not wait for one
    /// more round trip: a run of a consumer with 64 in flight on
    /// PostgreSQL went from 0.50–0.64 of publishing directly to 0.68–0.87
    /// (BENCHMARKS.md). A process that exits before the clearing lands
    /// leaves the mark, and a dispatcher sends the messages again after
    /// the hold, under the same ids. A store in the process (the store
    /// decides time itself) clears it at once.
    pub(crate) async fn dispatch_run_marked(
        &self,
        index: &Arc<dyn DynPendingSends>,
        run: &RecordId,
        fence: u64,
        messages: &[Message],
    ) {
        if self.dispatch(messages, "run").await.is_err() {
            return;
        }
        if self.store().local_now().is_some() {
            return clear_mark(index.as_ref(), run, fence).await;
        }
        let (index, run) = (Arc::clone(index), run.clone());
        tokio::spawn(async move { clear_mark(index.as_ref(), &run, fence).await });
    }

    /// Writes `scope`'s entry in the registry unless this process did so
    /// within the hour.
    async fn register(&self, scope: &Scope) {
        let Some(outbox) = self.outbox_config() else {
            return;
        };
        let fresh = outbox
            .registered
            .lock()
            .get(scope)
            .is_some_and(|at| at.elapsed() < REGISTERED_FOR);
        if fresh {
            return;
        }
        let entry = registry_id(scope);
        let keep = REGISTRY_RETENTION.max(self.retention().saturating_mul(2));
        let params = ClaimParams::new(self.lease(), keep);
        let registered = match self.store().claim(&entry, &params).await {
            Ok(ClaimOutcome::Acquired(lease)) => self
                .store()
                .complete(&lease, plain(scope.as_str().as_bytes()), keep)
                .await
                .is_ok(),
            Ok(ClaimOutcome::Completed(_)) => true,
            Ok(_) | Err(_) => false,
        };
        if registered {
            outbox
                .registered
                .lock()
                .insert(scope.clone(), std::time::Instant::now());
        }
    }

    /// Sends `messages` in order, each tried a few times while the broker
    /// is unavailable: how many were sent, or the error that stopped it.
    pub(crate) async fn dispatch(&self, messages: &[Message], by: &'static str) -> Dispatched {
        let Some(sender) = self.sender() else {
            return Err(SendError::NoOutbox);
        };
        for message in messages {
            let mut tries = 0;
            let mut delay = Duration::from_millis(50);
            loop {
                tries += 1;
                match sender.send(message).await {
                    Ok(()) => {
                        m::outbox_sent(message.id());
                        break;
                    }
                    Err(error @ SendError::Unavailable(_)) if tries < SEND_TRIES => {
                        tracing::debug!(%error, tries, "sending an outbox message failed; trying again");
                        tokio::time::sleep(delay).await;
                        delay *= 4;
                    }
                    Err(error) => {
                        m::count(m::OUTBOX_FAILED, &[("by", by), ("error", error.label())]);
                        tracing::warn!(%error, id = message.id(), destination = message.destination(), by, "an outbox message was not sent; it stays pending");
                        return Err(error);
                    }
                }
            }
        }
        m::count(m::OUTBOX_DISPATCHES, &[("by", by)]);
        Ok(messages.len())
    }

    /// After a sending run's completion, kept for `retention`, was
    /// stored (with its marker held by
    /// [`hold_outbox_marker`](Self::hold_outbox_marker)): dispatches its
    /// messages and, once all are confirmed, completes the marker. A
    /// dispatch that fails, or an executor without a sender, leaves the
    /// marker to run out: a dispatcher takes it over and sends them.
    pub async fn dispatch_held(
        &self,
        messages: &[Message],
        marker: HeldMarker,
        retention: Duration,
    ) {
        // Without a sender nothing is sent here: the marker runs out and
        // a dispatcher elsewhere sends them.
        if self.dispatch(messages, "run").await.is_ok() {
            if let Some(lease) = &marker.lease {
                self.confirm_marker(lease, retention.saturating_sub(marker.since.elapsed()))
                    .await;
            }
        }
    }

    /// A marker's completion once its run's messages are confirmed, kept
    /// `keep`: no longer than the run's record (the marker was claimed
    /// before the completion, so the run's record expires no earlier),
    /// so a later run of the key after both expired claims a fresh one.
    /// A completion, not a release: it goes with the runs' own
    /// completions in the store's group commit, and a holder that lost
    /// its run finishing late finds the marker done and sends nothing.
    /// Lost, it only means the messages are sent again, under the same
    /// ids.
    async fn confirm_marker(&self, marker: &Lease, keep: Duration) {
        if keep.is_zero() {
            return self.release_marker(marker).await;
        }
        let done = self.store().complete(marker, plain(&[]), keep);
        if let Err(error) = m::timed(m::OP_COMPLETE, done).await {
            tracing::debug!(%error, "the outbox marker was not completed; the messages may be sent again");
        }
    }

    /// The messages of a run with no claim (fail-open, the store down):
    /// sent at once, with nothing to store them in — or, when this
    /// executor does not send them itself, dropped with a warning.
    pub(crate) async fn dispatch_unguarded(&self, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        if self.sender().is_none() {
            tracing::warn!(
                messages = messages.len(),
                "a run let through with the store down sent messages, and this executor has no sender of its own: they are dropped"
            );
            return;
        }
        let _ = self.dispatch(&messages, "unguarded").await;
    }

    /// Whether a run that sends holds a marker: unless the store keeps
    /// and sends the messages itself.
    pub(crate) fn holds_markers(&self) -> bool {
        self.outbox_config()
            .is_some_and(|outbox| !matches!(outbox.sent_by, SentBy::Store))
    }

    /// A marker's release once its messages are confirmed; a release
    /// lost only means they are sent again, under the same ids.
    pub(crate) async fn release_marker(&self, marker: &Lease) {
        if let Err(error) = m::timed(m::OP_RELEASE, self.store().release(marker)).await {
            tracing::debug!(%error, "the outbox marker was not released; the messages may be sent again");
        }
    }

    /// When a duplicate is answered with `stored` (by [`run`](Self::run),
    /// or by a server answering its callers' claims): re-dispatches the
    /// messages stored with the run if no dispatch of them is confirmed
    /// and none is under way (its mark's hold or its marker's lease ran
    /// out, or the marker was never written). What is sent is read from
    /// the record as it is now, never from `stored`, which a cache may
    /// have kept from an earlier run of the key.
    pub async fn redispatch_stored(&self, run: &RecordId, stored: &[u8]) {
        if self.sender().is_none() {
            return;
        }
        if self
            .replayed_messages(run, stored)
            .is_none_or(|m| m.is_empty())
        {
            return;
        }
        let index = self.store().pending_sends();
        if let Some(index) = &index {
            if let Ok(Some(taken)) = index.take_pending_run(run, self.lease()).await {
                if self.send_again(&taken.id, &taken.response).await {
                    clear_mark(index.as_ref(), &taken.id, taken.fence).await;
                }
                return;
            }
        }
        let marker = marker_id(run);
        match self.store().peek(&marker).await {
            Ok(Some(record)) if !matches!(record.state, State::InProgress { .. }) => return,
            // No marker: on a store with a pending index the run was
            // marked instead (and its mark is held, or cleared); on one
            // without, the marker's claim failed and the replay sends.
            Ok(None) if index.is_some() => return,
            Ok(_) => {}
            Err(_) => return,
        }
        let Some(lease) = self.take_pending_marker(&marker).await else {
            return;
        };
        let sent = match self.store().peek(run).await {
            Ok(Some(Record {
                state: State::Completed { response },
                ..
            })) => self.send_again(run, &response).await,
            _ => false,
        };
        if sent {
            self.release_marker(&lease).await;
        }
    }

    /// A replay's dispatch of the messages stored with `run`'s
    /// `response`: whether all were sent.
    async fn send_again(&self, run: &RecordId, response: &[u8]) -> bool {
        match self.replayed_messages(run, response) {
            Some(messages) => self.dispatch(&messages, "replay").await.is_ok(),
            None => false,
        }
    }

    /// The messages stored with a replayed run's `response`; `None`, with
    /// a warning, when they do not read.
    fn replayed_messages(&self, run: &RecordId, response: &[u8]) -> Option<Vec<Message>> {
        stored_messages(self.at_rest(), run, response)
            .inspect_err(|reason| {
                tracing::warn!(%reason, "the messages stored with a replayed run do not read");
            })
            .ok()
    }

    /// Takes `marker` if it is pending and nobody alive holds it: held by
    /// a process whose lease ran out (a takeover), or never written (the
    /// first claim). A marker confirmed meanwhile by whoever held it is
    /// `None`: completed, the claim answers so; released, the claim
    /// acquires it, and it is given back at once.
    pub(crate) async fn take_pending_marker(&self, marker: &RecordId) -> Option<Lease> {
        let claimed = self.store().claim(marker, &self.marker_params()).await;
        let Ok(ClaimOutcome::Acquired(lease)) = claimed else {
            return None;
        };
        if lease.takeover || lease.attempt == 1 {
            return Some(lease);
        }
        self.release_marker(&lease).await;
        None
    }
}

/// Clears the mark of `run`, completed under `fence`, once its messages
/// are confirmed; a mark left only means they are sent again, under the
/// same ids.
pub(crate) async fn clear_mark(index: &dyn DynPendingSends, run: &RecordId, fence: u64) {
    if let Err(error) = m::timed(m::OP_CONFIRM, index.confirm_sent(run, fence)).await {
        tracing::debug!(%error, "the outbox's pending mark was not cleared; the messages may be sent again");
    }
}
