//! What a run answers: [`Outcome`] or [`RunError`].

use std::time::Duration;

use super::STORE_RETRY_AFTER;
use crate::record::{Failure, FailureClass};
use crate::store::{BoxError, StoreError};

/// What a successful [`Idempotency::run`](crate::Idempotency::run) did. Executed and replayed
/// results are distinguished everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The handler ran now and its result was stored.
    Executed {
        /// The handler's result.
        value: T,
        /// Which attempt ran it (1 for the first).
        attempt: u32,
        /// Whether this run took over from a worker whose lease expired:
        /// that earlier attempt may have partly run.
        takeover: bool,
    },
    /// The handler had already completed for this key; this is its stored
    /// result and nothing ran.
    Replayed {
        /// The stored result.
        value: T,
    },
    /// The store could not be reached and the executor was configured to
    /// fail open: the handler ran without any deduplication.
    Unguarded {
        /// The handler's result.
        value: T,
    },
}

impl<T> Outcome<T> {
    /// The result, however it was obtained.
    pub fn value(&self) -> &T {
        match self {
            Outcome::Executed { value, .. }
            | Outcome::Replayed { value }
            | Outcome::Unguarded { value } => value,
        }
    }

    /// The result, however it was obtained.
    pub fn into_value(self) -> T {
        match self {
            Outcome::Executed { value, .. }
            | Outcome::Replayed { value }
            | Outcome::Unguarded { value } => value,
        }
    }

    /// Whether this is a replay of an earlier execution.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed { .. })
    }
}

/// Why [`Idempotency::run`](crate::Idempotency::run) returned no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError<E> {
    /// Another worker holds a live claim on this key. Nothing ran; try
    /// again after `retry_after`.
    #[error("request with this key is in progress elsewhere; retry after {retry_after:?}")]
    InProgress {
        /// Until the other claim's lease runs out.
        retry_after: Duration,
    },
    /// The key was used before with a different fingerprint. Nothing ran.
    #[error("key was already used with a different request fingerprint")]
    Mismatch,
    /// A retry that came after its key's record expired, which the store
    /// remembers ([`crate::horizon`]): refused rather than run again, as
    /// the first run's outcome is gone. Nothing ran.
    #[error("key expired: its record ended about {}s ago and is no longer kept", age.as_secs())]
    Forgotten {
        /// About how long ago the key's record ended: the time since it
        /// expired (to the day, once the record itself is gone), plus this
        /// executor's retention.
        age: Duration,
    },
    /// The handler ran now and failed; the failure was recorded.
    #[error("handler failed on attempt {attempt} ({class})")]
    Handler {
        /// The handler's error.
        #[source]
        error: E,
        /// How it was classified (after the max-attempts rule).
        class: FailureClass,
        /// Which attempt this was.
        attempt: u32,
        /// For retryable failures, the backoff before the next attempt.
        retry_after: Option<Duration>,
    },
    /// The handler failed for good on an earlier attempt; this is the
    /// stored failure, replayed. Nothing ran.
    #[error("replayed stored failure ({}): {}", .0.class, .0.message)]
    Failed(Failure),
    /// The handler ran but its response was too large to store; this was
    /// recorded as a terminal failure so it will not run again.
    #[error("response of {size} bytes exceeds the limit of {limit} bytes")]
    ResponseTooLarge {
        /// The encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The handler ran but its response could not be encoded; recorded as a
    /// terminal failure.
    #[error("response could not be encoded")]
    Encode(#[source] BoxError),
    /// A step of the handler was in doubt under the
    /// [`Park`](crate::step::Park) policy: the record is parked (failed,
    /// outcome unknown) until an operator resolves it. Later claims replay
    /// it as [`RunError::Failed`] with [`FailureClass::Unknown`].
    #[error("parked for reconciliation: {}", .0.message)]
    Parked(Failure),
    /// The stored response could not be decoded into the requested type.
    #[error("stored response could not be decoded: {reason}")]
    Decode {
        /// What went wrong.
        reason: String,
    },
    /// The handler ran, but its lease was taken over before the outcome
    /// could be stored; the new holder's outcome wins.
    #[error("lease lost before the outcome was stored")]
    LeaseLost,
    /// The store failed (fail-closed: if this happened at the claim, the
    /// handler did not run).
    #[error("idempotency store error")]
    Store(#[source] StoreError),
    /// A [`Durable`](crate::durable::Durable) run's input could not be
    /// journaled (it does not encode as JSON, or is over the size limit).
    /// Nothing was claimed and nothing ran.
    #[error("input could not be journaled: {reason}")]
    Input {
        /// What went wrong.
        reason: String,
    },
}

impl<E> RunError<E> {
    /// When it makes sense to try again, if ever: for in-progress keys,
    /// retryable failures and store errors.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RunError::InProgress { retry_after } => Some(*retry_after),
            RunError::Handler { retry_after, .. } => *retry_after,
            RunError::Store(_) => Some(STORE_RETRY_AFTER),
            _ => None,
        }
    }
}

pub(super) fn outcome_label<T, E>(result: &Result<Outcome<T>, RunError<E>>) -> &'static str {
    match result {
        Ok(Outcome::Executed { .. }) => "executed",
        Ok(Outcome::Replayed { .. }) => "replayed",
        Ok(Outcome::Unguarded { .. }) => "unguarded",
        Err(RunError::InProgress { .. }) => "in_progress",
        Err(RunError::Mismatch) => "mismatch",
        Err(RunError::Forgotten { .. }) => "forgotten",
        Err(RunError::Handler { .. }) => "handler_failed",
        Err(RunError::Failed(_)) => "replayed_failure",
        Err(RunError::ResponseTooLarge { .. }) => "response_too_large",
        Err(RunError::Parked(_)) => "parked",
        Err(RunError::Encode(_)) => "encode_error",
        Err(RunError::Decode { .. }) => "decode_error",
        Err(RunError::LeaseLost) => "lease_lost",
        Err(RunError::Store(_)) => "store_error",
        Err(RunError::Input { .. }) => "input_error",
    }
}
