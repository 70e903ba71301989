//! Claiming a key, waiting for an in-flight duplicate, and answering a
//! claim that did not acquire.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{deadline, Context, Held, Idempotency, Outcome, RunError};
use crate::cache::CACHE_HITS;
use crate::clock::Timestamp;
use crate::codec::{AtRest, Codec};
use crate::key::RecordId;
use crate::metrics as m;
use crate::outbox::Outgoing;
use crate::record::{ClaimOutcome, ClaimParams, Lease};
use crate::step::StepRun;
use crate::store::{Store, StoreError};

/// Where a claim left a run.
pub(crate) enum Claimed {
    /// Acquired: the lease, and when its claim was sent.
    Held {
        /// The lease.
        lease: Lease,
        /// When the claim was sent (the lease is measured from here).
        sent: Instant,
    },
    /// The store is unreachable and the executor fails open.
    Unguarded,
    /// Not acquired: see [`Idempotency::answer`].
    Answered(ClaimOutcome),
}

impl<S: Store, C: Codec> Idempotency<S, C> {
    /// Claims `id`, waiting up to `wait` for an in-flight duplicate. A
    /// store error with `fail_open` set is [`Claimed::Unguarded`].
    pub(crate) async fn acquire(
        &self,
        id: &RecordId,
        params: &ClaimParams,
        fail_open: bool,
        wait: Option<Duration>,
    ) -> Result<Claimed, StoreError> {
        let wait_until = wait.map(|w| deadline(Instant::now(), w));
        loop {
            let outcome = match self.claim_once(id, params).await {
                Ok(Claimed::Answered(outcome)) => outcome,
                Err(error @ StoreError::Unavailable(_)) if fail_open && !error.is_contention() => {
                    tracing::warn!(
                        scope = %id.scope(),
                        key = %self.logged_key(id),
                        %error,
                        "store unreachable; running unguarded (fail-open)"
                    );
                    m::count(m::FAIL_OPEN, &[]);
                    return Ok(Claimed::Unguarded);
                }
                other => return other,
            };
            match outcome {
                ClaimOutcome::InProgress { retry_after } => {
                    let remaining = wait_until.map_or(Duration::ZERO, |until| {
                        until.saturating_duration_since(Instant::now())
                    });
                    if remaining.is_zero() {
                        return Ok(Claimed::Answered(outcome));
                    }
                    self.store
                        .wait_for_change(id, retry_after.min(remaining))
                        .await;
                }
                other => return Ok(Claimed::Answered(other)),
            }
        }
    }

    /// One claim of `id`: held, or the store's answer.
    pub(crate) async fn claim_once(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<Claimed, StoreError> {
        if let Some(response) = self.remembered(id, params) {
            return Ok(Claimed::Answered(ClaimOutcome::Completed(response)));
        }
        let sent = Instant::now();
        let outcome = m::timed(m::OP_CLAIM, self.store.claim(id, params)).await?;
        m::claim(outcome.label());
        Ok(match outcome {
            ClaimOutcome::Acquired(lease) => Claimed::Held { lease, sent },
            other => Claimed::Answered(other),
        })
    }

    /// The store's time, or this machine's for a networked store.
    pub(crate) fn now(&self) -> Timestamp {
        self.store.local_now().unwrap_or_else(Timestamp::now)
    }

    /// The response of a run of `id` this executor completed, if its
    /// replay cache still holds it for this claim's fingerprint.
    pub(crate) fn remembered(&self, id: &RecordId, params: &ClaimParams) -> Option<Bytes> {
        let response = self
            .config
            .replays
            .get(id, params.fingerprint, || self.store.local_now())?;
        m::add(m::key!(CACHE_HITS));
        Some(response)
    }

    /// [`answer`](Self::answer), re-dispatching first the messages a
    /// replayed run sent if they were never confirmed.
    pub(crate) async fn replay<T: DeserializeOwned, E>(
        &self,
        id: &RecordId,
        outcome: ClaimOutcome,
    ) -> Result<Outcome<T>, RunError<E>> {
        if let ClaimOutcome::Completed(stored) = &outcome {
            self.redispatch_stored(id, stored).await;
        }
        self.answer(id, outcome)
    }

    /// What a claim that did not acquire means to the caller.
    pub(crate) fn answer<T: DeserializeOwned, E>(
        &self,
        id: &RecordId,
        outcome: ClaimOutcome,
    ) -> Result<Outcome<T>, RunError<E>> {
        match outcome {
            ClaimOutcome::Acquired(_) => unreachable!("an acquired claim is held, not answered"),
            ClaimOutcome::Completed(stored) => {
                m::add(m::key!(m::REPLAYS));
                self.decode(id, &stored)
                    .map(|value| Outcome::Replayed { value })
            }
            ClaimOutcome::Failed(failure) => {
                m::add(m::key!(m::REPLAYS));
                Err(RunError::Failed(failure))
            }
            ClaimOutcome::Mismatch => {
                m::count(m::MISMATCHES, &[]);
                Err(RunError::Mismatch)
            }
            ClaimOutcome::Forgotten { expired_at } => {
                m::count(m::FORGOTTEN, &[]);
                let since = self.now().since(expired_at);
                Err(RunError::Forgotten {
                    age: since.saturating_add(self.config.retention),
                })
            }
            ClaimOutcome::InProgress { retry_after } => Err(RunError::InProgress { retry_after }),
        }
    }

    /// Runs `handler` with no claim (fail-open, the store unreachable).
    pub(crate) async fn unguarded<T, E, F, Fut>(
        &self,
        id: &RecordId,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let ctx = unguarded_context(id, self.config.outbox.is_some());
        let outgoing = Arc::clone(&ctx.outgoing);
        let result = handler(ctx).await;
        let messages = outgoing.take();
        let value = result.map_err(|error| self.unguarded_failure(error))?;
        self.dispatch_unguarded(messages).await;
        Ok(Outcome::Unguarded { value })
    }

    /// A handler's `error` in a run with no claim: classified, nothing
    /// recorded (there is no record to write to).
    pub(crate) fn unguarded_failure<E: StdError + Send + Sync + 'static>(
        &self,
        error: E,
    ) -> RunError<E> {
        RunError::Handler {
            class: (self.config.classifier)(&error),
            error,
            attempt: 0,
            retry_after: None,
        }
    }
}

/// The context of a run of `id` with no claim (fail-open, the store
/// unreachable): no lease, no journal.
pub(crate) fn unguarded_context(id: &RecordId, outbox: bool) -> Context {
    let (_, held) = watch::channel(Held::default());
    Context {
        lease: None,
        held,
        steps: Arc::new(StepRun::new(
            id.clone(),
            None,
            0,
            AtRest::new(0, None),
            false,
        )),
        outgoing: Arc::new(Outgoing::new(outbox)),
    }
}
