//! Ending a run: storing its response or failure (retrying while the
//! store is briefly away), or parking it.

use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use super::{deadline, Idempotency, Outcome, RunError};
use crate::codec::Codec;
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;
use crate::metrics as m;
use crate::outbox::{encode_messages, Message};
use crate::record::{Failure, FailureClass, Lease, State};
use crate::store::{Store, StoreError};

impl<S: Store, C: Codec> Idempotency<S, C> {
    /// Ends a run whose [`Park`](crate::step::Park) step was in doubt: the
    /// record is kept as failed with an unknown outcome until an operator
    /// resolves it, whatever the handler returned.
    pub(super) async fn park<E>(&self, lease: &Lease, why: String) -> RunError<E> {
        m::count(m::PARKED, &[]);
        m::count(m::EXECUTIONS, &[("result", FailureClass::Unknown.as_str())]);
        tracing::warn!(
            scope = %lease.id.scope(),
            key = %self.logged_key(&lease.id),
            attempt = lease.attempt,
            %why,
            "parking the record for reconciliation"
        );
        let failure = Failure::new(FailureClass::Unknown, why);
        self.record_failure(lease, failure.clone()).await;
        RunError::Parked(failure)
    }

    pub(super) async fn store_success<T: Serialize, E>(
        &self,
        lease: &Lease,
        fingerprint: Option<Fingerprint>,
        value: T,
        messages: Vec<Message>,
    ) -> Result<Outcome<T>, RunError<E>> {
        let encoded = match self.codec.encode(&value) {
            Ok(encoded) => encoded,
            Err(error) => {
                let failure = Failure::new(
                    FailureClass::Terminal,
                    format!("response could not be encoded: {error}"),
                );
                self.record_failure(lease, failure).await;
                return Err(RunError::Encode(error));
            }
        };
        let frame = (!messages.is_empty()).then(|| encode_messages(&messages));
        let size = encoded.len() + frame.as_ref().map_or(0, Vec::len);
        let limit = self.config.max_response_bytes;
        if size > limit {
            return Err(self.too_large(lease, size, limit, "").await);
        }
        let sealed = self
            .config
            .at_rest
            .seal_run(&lease.id, encoded, frame.as_deref());
        if let Some(limit) = self.store.max_stored_bytes() {
            if sealed.len() > limit {
                return Err(self
                    .too_large(lease, sealed.len(), limit, " the store keeps")
                    .await);
            }
        }
        // Marked pending by the completion's own write where the store
        // keeps a pending index; otherwise a marker claimed before the
        // completion, so that once the messages are stored the dispatcher
        // can always find them.
        let pending = self.pending_index(&lease.id, &messages).await;
        let marker = match messages.is_empty() || !self.holds_markers() || pending.is_some() {
            true => None,
            false => Some(self.hold_outbox_marker(&lease.id).await),
        };
        let retention = self.config.retention;
        let sent = (Instant::now(), self.store.local_now());
        let (stored, uncertain) = self
            .with_store_retries(
                lease,
                || async {
                    match &pending {
                        Some(index) => {
                            let hold = self.config.lease;
                            (index.complete_pending(lease, sealed.clone(), retention, hold)).await
                        }
                        None => self.store.complete(lease, sealed.clone(), retention).await,
                    }
                },
                m::OP_COMPLETE,
            )
            .await;
        let stored = match stored {
            // An earlier try may have been applied before the store became
            // unreachable: then the record holds exactly these bytes.
            Err(StoreError::LeaseLost)
                if uncertain && self.stored_already(lease, &sealed).await =>
            {
                Ok(())
            }
            other => other,
        };
        match stored {
            Ok(()) => {
                m::add(m::key!(m::EXECUTIONS, "result" => "ok"));
                self.config
                    .replays
                    .put(&lease.id, fingerprint, sealed, retention, sent);
                if let Some(marker) = marker {
                    self.dispatch_held(&messages, marker, retention).await;
                }
                if let Some(index) = &pending {
                    self.dispatch_run_marked(index, &lease.id, lease.fence, &messages)
                        .await;
                }
                Ok(Outcome::Executed {
                    value,
                    attempt: lease.attempt,
                    takeover: lease.takeover,
                })
            }
            Err(StoreError::LeaseLost) => {
                m::count(m::LEASE_LOST, &[("at", "complete")]);
                tracing::warn!(
                    scope = %lease.id.scope(),
                    key = %self.logged_key(&lease.id),
                    "handler finished after its lease was taken over; its outcome was not stored"
                );
                Err(RunError::LeaseLost)
            }
            Err(refused) if refused.is_refusal() => {
                // The store answered and said no (too large, invalid,
                // corrupt): left in progress, the claim would be taken
                // over and the handler run again (docs/design.md §5.5).
                tracing::error!(
                    scope = %lease.id.scope(),
                    key = %self.logged_key(&lease.id),
                    error = %refused,
                    "the store refused the response; recording a terminal failure"
                );
                self.record_failure(lease, Failure::result_refused(&refused))
                    .await;
                Err(RunError::Store(refused))
            }
            Err(error) => Err(RunError::Store(error)),
        }
    }

    /// Records a response (with the run's messages) too large to store as
    /// a terminal failure.
    async fn too_large<E>(
        &self,
        lease: &Lease,
        size: usize,
        limit: usize,
        whose: &str,
    ) -> RunError<E> {
        let failure = Failure::new(
            FailureClass::Terminal,
            format!("response of {size} bytes exceeds the limit of {limit} bytes{whose}"),
        );
        self.record_failure(lease, failure).await;
        RunError::ResponseTooLarge { size, limit }
    }

    pub(super) async fn store_failure<E: StdError + Send + Sync + 'static>(
        &self,
        lease: &Lease,
        error: E,
    ) -> RunError<E> {
        let mut class = (self.config.classifier)(&error);
        let mut message = crate::error_chain(&error);
        let max = self.config.max_attempts.get();
        if class == FailureClass::Retryable && lease.attempt >= max {
            class = FailureClass::Terminal;
            message = format!("attempts exhausted ({} of {max}): {message}", lease.attempt);
        }
        m::count(m::EXECUTIONS, &[("result", class.as_str())]);
        self.record_failure(lease, Failure::new(class, message))
            .await;
        RunError::Handler {
            error,
            class,
            attempt: lease.attempt,
            retry_after: (class == FailureClass::Retryable)
                .then(|| self.config.backoff.delay(lease.attempt)),
        }
    }

    /// Records a failure; if the store refuses it (a message too large for
    /// it, say), records it again with the message cut short. If that
    /// cannot be done either, the lease simply runs out and a later
    /// attempt decides again.
    pub(super) async fn record_failure(&self, lease: &Lease, failure: Failure) {
        let retention = self.config.failure_retention;
        let fail = |failure: Failure| async move {
            let (recorded, _) = self
                .with_store_retries(
                    lease,
                    || self.store.fail(lease, failure.clone(), retention),
                    m::OP_FAIL,
                )
                .await;
            recorded
        };
        let short = failure.cut_short();
        let recorded = match (fail(failure).await, short) {
            (Err(StoreError::Backend(_) | StoreError::Corrupt { .. }), Some(short)) => {
                fail(short).await
            }
            (other, _) => other,
        };
        if let Err(error) = recorded {
            if matches!(error, StoreError::LeaseLost) {
                m::count(m::LEASE_LOST, &[("at", "fail")]);
            }
            tracing::warn!(
                scope = %lease.id.scope(),
                key = %self.logged_key(&lease.id),
                %error,
                "could not record the failure"
            );
        }
    }

    /// Retries a write a few times while the store is unavailable and the
    /// lease may still be held, so a blip does not turn a finished run into
    /// a re-run. Also says whether any try ended unavailable (and so may
    /// have been applied without an answer).
    async fn with_store_retries<Fut>(
        &self,
        lease: &Lease,
        mut op: impl FnMut() -> Fut,
        label: &'static str,
    ) -> (Result<(), StoreError>, bool)
    where
        Fut: Future<Output = Result<(), StoreError>>,
    {
        let mut delay = Duration::from_millis(20);
        let give_up = deadline(Instant::now(), self.config.lease);
        let mut uncertain = false;
        loop {
            match m::timed(label, op()).await {
                Err(StoreError::Unavailable(error))
                    if deadline(Instant::now(), delay) < give_up =>
                {
                    uncertain = true;
                    tracing::warn!(
                        scope = %lease.id.scope(),
                        key = %self.logged_key(&lease.id),
                        %error,
                        attempt = lease.attempt,
                        "store unavailable while recording the outcome; retrying"
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.config.lease / 4);
                }
                other => return (other, uncertain),
            }
        }
    }

    /// Whether the record already holds `sealed` as its completed response,
    /// completed under this lease: the record's fence is the lease's (a
    /// takeover's completion carries a newer one, whatever it stored) and
    /// it holds the same bytes once opened (a store may keep them in
    /// another envelope) — the response and the messages sent with it
    /// both, as a takeover that answered alike still sent messages of its
    /// own, which this holder must not send. Read with [`Store::peek`],
    /// never with a claim: a claim of a key deleted or expired meanwhile
    /// would create a record, bound to this request's fingerprint, that
    /// refuses a new request as a mismatch for a whole retention.
    async fn stored_already(&self, lease: &Lease, sealed: &[u8]) -> bool {
        let Ok(Some(record)) = self.store.peek(&lease.id).await else {
            return false;
        };
        if record.fence != lease.fence {
            return false;
        }
        if record.state.completed_with(sealed) {
            return true;
        }
        let State::Completed { response } = &record.state else {
            return false;
        };
        let max = self.config.max_response_bytes;
        let at_rest = &self.config.at_rest;
        let opened = |bytes: &[u8]| -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
            let response = at_rest.open_response(&lease.id, bytes, max)?.into_owned();
            let messages = at_rest.open_messages(&lease.id, bytes)?;
            Ok((response, messages.map(std::borrow::Cow::into_owned)))
        };
        matches!((opened(response), opened(sealed)), (Ok(stored), Ok(ours)) if stored == ours)
    }

    pub(super) fn decode<T: DeserializeOwned, E>(
        &self,
        id: &RecordId,
        stored: &[u8],
    ) -> Result<T, RunError<E>> {
        let bytes = self
            .config
            .at_rest
            .open_response(id, stored, self.config.max_response_bytes)
            .map_err(|reason| RunError::Decode { reason })?;
        self.codec.decode(&bytes).map_err(|e| RunError::Decode {
            reason: e.to_string(),
        })
    }
}
