//! Journaled steps: side effects that cannot be rolled back (a card
//! charge, an email, a call to a partner), made resumable inside one
//! handler with [`Context::step`](crate::Context::step).
//!
//! A handler that charges a card, reserves stock and sends an email and
//! crashes after the second must, on retry, neither repeat the first two
//! nor skip the third. Each step is:
//!
//! 1. **marked started** in the store (under the lease's token) before its
//!    work runs;
//! 2. **journaled** with its result after the work returns `Ok`;
//! 3. **replayed** on every later attempt: a finished step returns its
//!    journaled result and does not run again.
//!
//! A step found started but unfinished by a later attempt has an
//! **unknown** outcome: the earlier attempt may have crashed before the
//! effect, during it or after it. Its policy decides:
//!
#![doc = include_str!("../docs/steps.md")]
//!
//! A step whose work returns an error stays started (in doubt): an error
//! from a network call does not prove the effect did not happen. Check
//! what can be checked before the step, and return business outcomes (a
//! declined card) as `Ok` values so they are journaled.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use idem::step::{Retry, Skip, StepError};
//! use idem::{Idempotency, MemoryStore, RecordId};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum OrderError {
//!     #[error(transparent)]
//!     Step(#[from] StepError<std::io::Error>),
//! }
//!
//! let idem = Idempotency::builder(MemoryStore::new()).build()?;
//! let id = RecordId::parse("orders", "order-7")?;
//! let receipt = idem
//!     .run(&id, None, |ctx| async move {
//!         // The payment provider deduplicates on the derived key.
//!         let charge: String = ctx
//!             .step("charge", Retry, |s| async move {
//!                 Ok::<_, std::io::Error>(format!("charged under {}", s.key()))
//!             })
//!             .await?;
//!         // At most once: never a second email.
//!         let _sent: Option<()> = ctx.step("email", Skip, |_| async { Ok(()) }).await?;
//!         Ok::<_, OrderError>(charge)
//!     })
//!     .await?;
//! assert!(receipt.value().starts_with("charged under idem-"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::codec::AtRest;
use crate::key::{LoggedKey, RecordId};
use crate::store::{DynStepJournal, StoreError};

/// The longest step name, in bytes.
pub const MAX_STEP_NAME_LEN: usize = 128;

/// How many times a step's start or finish is tried while the store is
/// unavailable, before the step gives up with [`StepError::Store`].
const STORE_TRIES: u32 = 4;

/// What a step in doubt does; see the [module docs](self). Implemented by
/// [`Retry`], [`Skip`] and [`Park`] only.
pub trait InDoubt: sealed::Sealed + Copy + Send {
    /// What the step returns: `T` for [`Retry`] and [`Park`], `Option<T>`
    /// for [`Skip`] (`None` when it was skipped in doubt).
    type Output<T>;

    /// The policy's name, for logs and messages.
    const NAME: &'static str;

    #[doc(hidden)]
    const PARKS: bool = false;

    #[doc(hidden)]
    fn ran<T>(value: T) -> Self::Output<T>;

    #[doc(hidden)]
    fn skipped<T>() -> Option<Self::Output<T>>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Retry {}
    impl Sealed for super::Skip {}
    impl Sealed for super::Park {}
}

/// At least once: a step in doubt runs again, with the same downstream
/// key, so an external API that deduplicates on the key makes it exactly
/// once. The right policy for payment providers and any API that takes an
/// idempotency key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retry;

/// At most once: a step in doubt is not run again; the step returns
/// `None` and is journaled as skipped. For effects where a duplicate is
/// worse than a miss (a notification).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skip;

/// Stop and ask a person: a step in doubt is not run; the step returns
/// [`StepError::Parked`] and the run ends with the record parked (failed,
/// outcome unknown), listed by `idem list --state parked` and resolved
/// with `idem resolve`. For effects that can neither be repeated nor
/// skipped (a shipment without an idempotent API).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Park;

impl InDoubt for Retry {
    type Output<T> = T;
    const NAME: &'static str = "retry";
    fn ran<T>(value: T) -> T {
        value
    }
    fn skipped<T>() -> Option<T> {
        None
    }
}

impl InDoubt for Skip {
    type Output<T> = Option<T>;
    const NAME: &'static str = "skip";
    fn ran<T>(value: T) -> Option<T> {
        Some(value)
    }
    fn skipped<T>() -> Option<Option<T>> {
        Some(None)
    }
}

impl InDoubt for Park {
    type Output<T> = T;
    const NAME: &'static str = "park";
    const PARKS: bool = true;
    fn ran<T>(value: T) -> T {
        value
    }
    fn skipped<T>() -> Option<T> {
        None
    }
}

/// Why a step returned no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError<E> {
    /// The step's work ran and returned this error. The step stays marked
    /// started: a later attempt finds it in doubt and applies its policy.
    #[error("step {step:?} failed")]
    Failed {
        /// The step.
        step: String,
        /// The work's error.
        #[source]
        error: E,
    },
    /// The step is in doubt and its policy is [`Park`]: it did not run,
    /// and the run ends with the record parked for reconciliation.
    #[error("step {step:?} is in doubt (started by attempt {attempt}, never finished); the record is parked for reconciliation")]
    Parked {
        /// The step.
        step: String,
        /// The attempt that left it started.
        attempt: u32,
    },
    /// The lease was lost (another worker took over): the step did not
    /// run, or ran and could not be journaled (the new holder finds it in
    /// doubt).
    #[error("lease lost at step {step:?}")]
    LeaseLost {
        /// The step.
        step: String,
    },
    /// The store failed; if this was at the start, the step did not run.
    #[error("idempotency store error at step {step:?}")]
    Store {
        /// The step.
        step: String,
        /// What the store said.
        #[source]
        source: StoreError,
    },
    /// The store keeps no step journal (see
    /// [`Store::step_journal`](crate::Store::step_journal)); nothing ran.
    #[error("step {step:?}: this store keeps no step journal")]
    Unsupported {
        /// The step.
        step: String,
    },
    /// The step's name is not 1 to [`MAX_STEP_NAME_LEN`] bytes of visible
    /// ASCII; nothing ran.
    #[error("invalid step name {name:?}: {problem}")]
    InvalidName {
        /// The name given.
        name: String,
        /// The rule broken.
        problem: &'static str,
    },
    /// The same name was used by two steps of one run; nothing ran.
    #[error("step {step:?} was already used in this run; step names must be unique per handler")]
    DuplicateName {
        /// The step.
        step: String,
    },
    /// The step's result could not be journaled (it does not encode, or
    /// is over the size limit). The work ran; the step stays in doubt.
    #[error("step {step:?}: result could not be journaled: {reason}")]
    Encode {
        /// The step.
        step: String,
        /// What went wrong.
        reason: String,
    },
    /// The journaled result does not decode into the step's type (the
    /// code changed under a live record), or the step was skipped by an
    /// earlier attempt and its policy is no longer [`Skip`].
    #[error("step {step:?}: journaled result cannot be used: {reason}")]
    Decode {
        /// The step.
        step: String,
        /// What went wrong.
        reason: String,
    },
}

/// What a step's work is given.
#[derive(Debug, Clone)]
pub struct StepCtx {
    pub(crate) key: String,
    pub(crate) name: String,
    pub(crate) attempt: u32,
    pub(crate) fence: Option<u64>,
    pub(crate) in_doubt: bool,
}

impl StepCtx {
    /// The step's **downstream key**: the same for every attempt and every
    /// worker (derived from the record's scope, its key and the step's
    /// name), so pass it as the idempotency key of the external call and a
    /// step retried in doubt is deduplicated by the other side. 69
    /// characters, `idem-` and 64 hex digits: accepted wherever keys of up
    /// to 255 visible ASCII characters are (Stripe, the IETF draft).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which attempt of the record is running the step.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The run's fencing number (`None` when unguarded), for downstream
    /// writes that can reject an older holder.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// Whether an earlier attempt started this step and never finished
    /// it, so the effect may already have happened (only with [`Retry`]).
    pub fn in_doubt(&self) -> bool {
        self.in_doubt
    }
}

/// The downstream key of step `step` of record `id`: `idem-` and the hex
/// SHA-256 of the scope, key and step name (each length-prefixed, so no
/// two triples collide). Stable across attempts, workers and releases.
///
/// ```
/// let id = idem::RecordId::parse("orders", "order-7").unwrap();
/// let key = idem::step::downstream_key(&id, "charge");
/// assert_eq!(key.len(), 69);
/// assert_eq!(key, idem::step::downstream_key(&id, "charge"));
/// assert_ne!(key, idem::step::downstream_key(&id, "refund"));
/// ```
pub fn downstream_key(id: &RecordId, step: &str) -> String {
    let mut hash = Sha256::new();
    for part in [id.scope().as_str(), id.key().as_str(), step] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    format!("idem-{}", hex::encode(hash.finalize()))
}

/// Why a run parked: `step "NAME" is in doubt (started by attempt N,
/// never finished)`, the failure message of its record.
pub(crate) fn parked_reason(step: &str, attempt: u32) -> String {
    format!("step {step:?} is in doubt (started by attempt {attempt}, never finished)")
}

/// The step a parked record's failure message names as the one in doubt
/// (the executor's wording), if it names one: what a reconciler asks
/// about.
pub fn parked_step(message: &str) -> Option<String> {
    let rest = message.strip_prefix("step \"")?;
    let mut name = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return chars.as_str().starts_with(" is in doubt").then_some(name),
            '\\' => name.push(chars.next()?),
            c => name.push(c),
        }
    }
    None
}

/// Checks a step name: 1 to [`MAX_STEP_NAME_LEN`] bytes of visible ASCII
/// (`0x21..=0x7E`), not starting with `$` (reserved for idem's own journal
/// entries, such as a [`Durable`](crate::durable::Durable) run's input).
/// The error names the rule broken.
pub fn check_step_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("is empty")
    } else if name.starts_with('$') {
        Err("starts with '$', which is reserved for idem's own entries")
    } else if name.len() > MAX_STEP_NAME_LEN {
        Err("is longer than 128 bytes")
    } else if !name.bytes().all(|b| (0x21..=0x7E).contains(&b)) {
        Err("contains a byte outside visible ASCII (0x21..=0x7E)")
    } else {
        Ok(())
    }
}

/// The steps of one run, shared by the clones of its [`Context`](crate::Context).
pub(crate) struct StepRun {
    pub(crate) id: RecordId,
    pub(crate) journal: Option<Arc<dyn DynStepJournal>>,
    pub(crate) max_result_bytes: usize,
    pub(crate) at_rest: AtRest,
    pub(crate) begun: Mutex<HashSet<String>>,
    pub(crate) parked: Mutex<Option<String>>,
    /// Whether logs show the run's key itself (`log_keys`) or its hash.
    pub(crate) log_keys: bool,
}

impl fmt::Debug for StepRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepRun")
            .field("journal", &self.journal.is_some())
            .field("parked", &*self.parked.lock())
            .finish_non_exhaustive()
    }
}

impl StepRun {
    pub(crate) fn new(
        id: RecordId,
        journal: Option<Arc<dyn DynStepJournal>>,
        max_result_bytes: usize,
        at_rest: AtRest,
        log_keys: bool,
    ) -> Self {
        Self {
            id,
            journal,
            max_result_bytes,
            at_rest,
            begun: Mutex::new(HashSet::new()),
            parked: Mutex::new(None),
            log_keys,
        }
    }

    /// Why the run parked its record, if a [`Park`] step found itself in
    /// doubt.
    pub(crate) fn parked(&self) -> Option<String> {
        self.parked.lock().clone()
    }
}

/// Runs a store call of step `step` of the run of `key`, retrying a few
/// times while the store is unavailable.
pub(crate) async fn with_retries<T, Fut>(
    key: LoggedKey<'_>,
    step: &str,
    mut op: impl FnMut() -> Fut,
) -> Result<T, StoreError>
where
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(25);
    let mut tries = 1;
    loop {
        match op().await {
            Err(StoreError::Unavailable(error)) if tries < STORE_TRIES => {
                tracing::warn!(
                    scope = %key.scope(),
                    %key,
                    step,
                    %error,
                    "store unavailable at a step; retrying"
                );
                tokio::time::sleep(delay).await;
                delay *= 2;
                tries += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parked_step_is_read_back_from_the_reason() {
        for name in ["ship", "a\"b", "back\\slash", "x.y-z"] {
            assert_eq!(parked_step(&parked_reason(name, 3)).as_deref(), Some(name));
        }
        assert_eq!(parked_step("handler failed: step \"ship\""), None);
        assert_eq!(parked_step("step \"ship\" failed"), None);
        assert_eq!(parked_step("step \"unterminated"), None);
    }
}
