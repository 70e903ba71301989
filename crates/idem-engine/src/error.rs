//! [`EngineError`]: every way a call into the engine ends without its
//! answer, one variant per exception a binding raises.

use std::convert::Infallible;
use std::time::Duration;

use idem::step::StepError;
use idem::{FailureClass, KeyError, RunError, StoreError};

use crate::store::{OpenError, StoreUrlError};

/// Why a call into the [`Engine`](crate::Engine) gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The store URL is not one idem reads.
    #[error(transparent)]
    Url(#[from] StoreUrlError),
    /// The store named could not be opened.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A setting is out of range (a lease of zero, a retention too short).
    #[error("invalid setting: {0}")]
    Config(String),
    /// The scope or key breaks the key rules (docs/design.md §2).
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A value given as JSON (a result, a fingerprint) is not JSON.
    #[error("{what} is not valid JSON: {reason}")]
    Json {
        /// Which value.
        what: &'static str,
        /// The parser's complaint.
        reason: String,
    },
    /// Another worker holds a live claim on the key; nothing ran.
    #[error("the key is in progress elsewhere; retry after {retry_after:?}")]
    InProgress {
        /// Until the other claim's lease runs out.
        retry_after: Duration,
    },
    /// The key was used before with another fingerprint; nothing ran.
    #[error("the key was already used with a different fingerprint")]
    Mismatch,
    /// The key ran before and its record has expired; the store remembers
    /// the key ([`idem::horizon`]), so this late call is refused rather
    /// than run again. Nothing ran.
    #[error(
        "the key ran about {}s ago and its record has expired: refused rather than run again",
        age.as_secs()
    )]
    KeyExpired {
        /// How long ago the key's record ended, at least.
        age: Duration,
    },
    /// The key failed for good before (or is parked in doubt): its stored
    /// failure, replayed. Nothing ran.
    #[error("replayed stored failure ({class}): {message}")]
    ReplayedFailure {
        /// How it failed.
        class: FailureClass,
        /// What failed.
        message: String,
    },
    /// The run's lease was lost (the process stalled past it and another
    /// worker took the key over): nothing of this run was written.
    #[error("lease lost: another worker may be running this key; nothing was written")]
    LeaseLost,
    /// The result is over the store's limit; it was recorded as a terminal
    /// failure.
    #[error("the result of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The result's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A step of the run: its name, its journal, or its result.
    #[error(transparent)]
    Step(#[from] StepError<Infallible>),
    /// The store failed, or stayed away for a whole lease; a claim that
    /// meets this ran nothing.
    #[error("idempotency store error")]
    Store(#[source] StoreError),
    /// A run begun in another process: a forked child never ends its
    /// parent's runs.
    #[error("this run was begun in process {began_in}, not this one (a fork): end it there")]
    OtherProcess {
        /// The process that began the run.
        began_in: u32,
    },
    /// A message the run sends was refused: the engine has no outbox, or
    /// the message is malformed or over the size limit, or the run has
    /// ended.
    #[error("the message cannot be sent: {0}")]
    Send(#[from] idem::outbox::SendError),
    /// An answer of the executor newer than this engine.
    #[error("unexpected answer from the executor: {0}")]
    Unexpected(String),
    /// The engine's runtime could not be started.
    #[error("cannot start the engine's runtime")]
    Runtime(#[source] std::io::Error),
}

impl EngineError {
    /// The name of the exception every binding raises for this error:
    /// `InvalidInput`, `Unavailable`, `InProgress`, `Mismatch`,
    /// `KeyExpired`, `ReplayedFailure`, `LeaseLost`, `ResultTooLarge`, `StepInDoubt`,
    /// `InvalidStep`, or `IdemError` for the rest. One table, so the
    /// languages cannot drift apart.
    pub fn kind(&self) -> &'static str {
        match self {
            EngineError::Url(_)
            | EngineError::Config(_)
            | EngineError::Key(_)
            | EngineError::Json { .. }
            | EngineError::Send(_) => "InvalidInput",
            EngineError::Open(_) | EngineError::Store(_) => "Unavailable",
            EngineError::InProgress { .. } => "InProgress",
            EngineError::Mismatch => "Mismatch",
            EngineError::KeyExpired { .. } => "KeyExpired",
            EngineError::ReplayedFailure { .. } => "ReplayedFailure",
            EngineError::LeaseLost => "LeaseLost",
            EngineError::TooLarge { .. } => "ResultTooLarge",
            EngineError::Step(step) => match step {
                StepError::Parked { .. } => "StepInDoubt",
                StepError::LeaseLost { .. } => "LeaseLost",
                StepError::Store { .. } => "Unavailable",
                _ => "InvalidStep",
            },
            _ => "IdemError",
        }
    }

    /// When trying again makes sense, if ever.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            EngineError::InProgress { retry_after } => Some(*retry_after),
            EngineError::Store(_) => Some(idem::STORE_RETRY_AFTER),
            _ => None,
        }
    }
}

impl<E> From<RunError<E>> for EngineError {
    fn from(error: RunError<E>) -> Self {
        match error {
            RunError::InProgress { retry_after } => EngineError::InProgress { retry_after },
            RunError::Mismatch => EngineError::Mismatch,
            RunError::Forgotten { age } => EngineError::KeyExpired { age },
            RunError::Failed(failure) | RunError::Parked(failure) => EngineError::ReplayedFailure {
                class: failure.class,
                message: failure.message,
            },
            RunError::ResponseTooLarge { size, limit } => EngineError::TooLarge { size, limit },
            RunError::Encode(source) => EngineError::Json {
                what: "the result",
                reason: idem::error_chain(&*source),
            },
            RunError::Decode { reason } => EngineError::Json {
                what: "the stored result",
                reason,
            },
            RunError::Input { reason } => EngineError::Json {
                what: "the input",
                reason,
            },
            RunError::LeaseLost => EngineError::LeaseLost,
            RunError::Store(StoreError::LeaseLost) => EngineError::LeaseLost,
            RunError::Store(source) => EngineError::Store(source),
            // A handler's failure is answered by `Run::fail` itself.
            RunError::Handler { class, .. } => EngineError::ReplayedFailure {
                class,
                message: "the handler failed".to_owned(),
            },
            other => EngineError::Unexpected(other.to_string()),
        }
    }
}

/// A handler's failure, as the binding reports it: its message and how
/// the handler's language classified it (a `Terminal` exception is
/// terminal, anything else retryable).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct HandlerFailure {
    /// What failed (the exception's text).
    pub message: String,
    /// How it failed.
    pub class: FailureClass,
}

impl HandlerFailure {
    /// A failure of the class named `class` (`retryable`, `terminal` or
    /// `unknown`, as [`FailureClass::as_str`] names them).
    pub fn named(message: String, class: &str) -> Result<Self, EngineError> {
        let class = FailureClass::parse(class).ok_or_else(|| {
            EngineError::Config(format!(
                "failure class {class:?}: use \"retryable\", \"terminal\" or \"unknown\""
            ))
        })?;
        Ok(Self { message, class })
    }
}
