//! The dispatcher: finds the runs whose messages were stored and never
//! confirmed sent (the process that completed them died, or its broker
//! was away), and sends them.

use std::time::Duration;

use super::dispatch::clear_mark;
use super::{marker_scope, run_scope_of, stored_messages, REGISTRY_SCOPE};
use crate::codec::{open, Codec};
use crate::executor::Idempotency;
use crate::key::{RecordId, Scope};
use crate::metrics as m;
use crate::purger::PurgerHandle;
use crate::record::{State, StateKind};
use crate::store::{FindAbandoned, ListQuery, ListRecords, Store, StoreError};

/// How often [`Idempotency::spawn_outbox_dispatcher`] looks by default:
/// a message whose inline dispatch failed waits about this long plus a
/// lease.
pub const DEFAULT_DISPATCH_INTERVAL: Duration = Duration::from_secs(5);

/// Markers looked at per scope and pass.
const BATCH: usize = 256;

/// What one pass of the dispatcher did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchPass {
    /// Pending markers found (their holder gone).
    pub pending: usize,
    /// Runs whose messages were all sent and their marker released.
    pub runs: usize,
    /// Messages sent.
    pub messages: usize,
    /// Runs whose messages could not all be sent (left pending).
    pub failed: usize,
}

impl std::ops::AddAssign for DispatchPass {
    fn add_assign(&mut self, other: Self) {
        self.pending += other.pending;
        self.runs += other.runs;
        self.messages += other.messages;
        self.failed += other.failed;
    }
}

impl<S, C> Idempotency<S, C>
where
    S: Store + ListRecords + FindAbandoned + Clone,
    C: Codec + Clone,
{
    /// One pass of the dispatcher: for every scope with runs that sent
    /// messages, takes each run the store's pending index marked whose
    /// hold ran out, sends its messages and clears the mark; and takes
    /// over each marker whose holder is gone (its lease ran out), and if
    /// its run is completed sends the run's messages and releases the
    /// marker. A marker whose run is not completed (still
    /// running, or never to complete) is left to run out and looked at
    /// again; it lives no longer than the run's record would.
    ///
    /// Several dispatchers may run at once: each marked run is taken by
    /// one of them, each marker by one claim, fenced like any other.
    pub async fn dispatch_pending(&self) -> Result<DispatchPass, StoreError> {
        let mut pass = DispatchPass::default();
        let registry = Scope::new(REGISTRY_SCOPE).expect("a valid scope");
        let mut query = ListQuery::new(BATCH)
            .scope(registry)
            .state(StateKind::Completed);
        loop {
            let page = self.store().list(&query).await?;
            for (entry, record) in &page.records {
                let State::Completed { response } = &record.state else {
                    continue;
                };
                let Some(scope) = open(response.as_ref(), 1024)
                    .ok()
                    .and_then(|named| run_scope_of(entry, &named))
                else {
                    continue;
                };
                pass += self.dispatch_scope(&scope).await?;
            }
            match page.next {
                Some(next) => query = query.after(next),
                None => break,
            }
        }
        metrics::gauge!(m::OUTBOX_PENDING).set(pass.pending as f64);
        Ok(pass)
    }

    /// One pass of the dispatcher over the runs of `scope` alone (see
    /// [`dispatch_pending`](Self::dispatch_pending)).
    pub async fn dispatch_scope(&self, scope: &Scope) -> Result<DispatchPass, StoreError> {
        let mut pass = self.dispatch_marked_runs(scope).await?;
        let found = self.store().abandoned(&marker_scope(scope), BATCH).await?;
        pass.pending += found.len();
        for (marker, _) in found {
            let Some(lease) = self.take_pending_marker(&marker).await else {
                continue; // another dispatcher took it, or sent its messages
            };
            let run = RecordId::new(scope.clone(), marker.key().clone());
            let Some(record) = self.store().peek(&run).await? else {
                tracing::error!(scope = %scope, "an outbox marker outlived its run's record: its messages are lost");
                self.release_marker(&lease).await;
                continue;
            };
            let response = match &record.state {
                State::Completed { response } => response,
                // Still running: the marker runs out and is looked at again.
                State::InProgress { .. } => continue,
                // Ended without its completion (refused, failed, given
                // back): it sent nothing, and a later run of it holds the
                // marker again.
                State::Failed { .. } | State::Released { .. } => {
                    self.release_marker(&lease).await;
                    continue;
                }
            };
            if self.send_stored(&run, response, &mut pass).await {
                self.release_marker(&lease).await;
            }
        }
        Ok(pass)
    }

    /// Sends the messages stored with `run`'s `response`, counting what it
    /// did in `pass`: whether all were sent.
    async fn send_stored(&self, run: &RecordId, response: &[u8], pass: &mut DispatchPass) -> bool {
        let messages = match stored_messages(self.at_rest(), run, response) {
            Ok(messages) => messages,
            Err(reason) => {
                tracing::error!(%reason, "the messages stored with a run do not read; left pending");
                pass.failed += 1;
                return false;
            }
        };
        match self.dispatch(&messages, "dispatcher").await {
            Ok(sent) => {
                pass.runs += 1;
                pass.messages += sent;
                true
            }
            Err(_) => {
                pass.failed += 1;
                false
            }
        }
    }

    /// The part of a pass over `scope` that the store's pending index
    /// answers (none without one): each run marked pending whose hold ran
    /// out, taken by this dispatcher alone, sent and its mark cleared.
    async fn dispatch_marked_runs(&self, scope: &Scope) -> Result<DispatchPass, StoreError> {
        let mut pass = DispatchPass::default();
        let Some(index) = self.store().pending_sends() else {
            return Ok(pass);
        };
        loop {
            let taken = index.take_pending(scope, self.lease(), BATCH).await?;
            let full = taken.len() >= BATCH;
            pass.pending += taken.len();
            for run in taken {
                if self.send_stored(&run.id, &run.response, &mut pass).await {
                    clear_mark(index.as_ref(), &run.id, run.fence).await;
                }
            }
            if !full || pass.failed > 0 {
                return Ok(pass);
            }
        }
    }

    /// Starts the dispatcher on the current Tokio runtime: a
    /// [`dispatch_pending`](Self::dispatch_pending) pass every `every`
    /// (see [`DEFAULT_DISPATCH_INTERVAL`]), errors logged and retried at
    /// the next. Runs' messages are dispatched as soon as each run is
    /// stored; the dispatcher only sends what a process that died, or a
    /// broker that was away, left behind. Stops when the handle is
    /// dropped.
    pub fn spawn_outbox_dispatcher(&self, every: Duration) -> PurgerHandle {
        let idem = self.clone();
        PurgerHandle::new(crate::purger::every(every, move || {
            let idem = idem.clone();
            async move {
                if let Err(error) = idem.dispatch_pending().await {
                    tracing::warn!(%error, "the outbox dispatcher's pass failed; retrying at the next");
                }
            }
        }))
    }
}
