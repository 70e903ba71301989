//! A run whose effect as a whole is in doubt: a handler that passed the
//! work on (a request forwarded, a call made) and lost the answer cannot
//! say whether it took effect. It marks the run's effect in doubt in the
//! step journal before failing with an unknown outcome; someone who can
//! find out — an operator, or a reconciler that asks the service — then
//! settles it with
//! [`StepJournal::resolve_step`](crate::StepJournal::resolve_step) on
//! [`EFFECT_STEP`], atomically with the record's release:
//!
//! - [`Resolution::Applied`](crate::Resolution::Applied) with the run's
//!   outcome: the next attempt finds it with
//!   [`Context::settled_effect`] and completes with it, running nothing;
//! - [`Resolution::NotApplied`](crate::Resolution::NotApplied): the mark
//!   is removed and the next attempt runs the work.

use bytes::Bytes;

use super::Context;
use crate::record::StepState;
use crate::step::with_retries;
use crate::store::StoreError;

/// The journal entry that stands for a run's whole effect (reserved: user
/// step names cannot start with `$`). Its result, once settled applied, is
/// the run's outcome as the handler would have returned it, encoded by
/// the handler's owner (the HTTP layer: the stored response).
pub const EFFECT_STEP: &str = "$effect";

impl Context {
    /// Marks this run's effect in doubt ([`EFFECT_STEP`] started by this
    /// attempt), for a handler about to fail with an unknown outcome, so
    /// the record can be settled later instead of only released by hand.
    /// `false` when there is nothing to mark under: the run is unguarded or
    /// the store keeps no step journal.
    pub async fn effect_in_doubt(&self) -> Result<bool, StoreError> {
        let (Some(lease), Some(journal)) = (self.lease(), self.steps.journal.as_deref()) else {
            return Ok(false);
        };
        with_retries(|| journal.begin_step(lease, EFFECT_STEP)).await?;
        Ok(true)
    }

    /// On an attempt after the first: the outcome settled for an effect an
    /// earlier attempt left in doubt ([`EFFECT_STEP`] resolved applied),
    /// opened from its seal. `None` otherwise — and on a first attempt,
    /// without reading anything.
    pub async fn settled_effect(&self) -> Result<Option<Bytes>, StoreError> {
        let (Some(lease), Some(journal)) = (self.lease(), self.steps.journal.as_deref()) else {
            return Ok(None);
        };
        if lease.attempt <= 1 {
            return Ok(None);
        }
        let steps = with_retries(|| journal.steps(&lease.id)).await?;
        let Some(result) = steps.into_iter().find_map(|entry| match entry.state {
            StepState::Done { result } if entry.name == EFFECT_STEP && !result.is_empty() => {
                Some(result)
            }
            _ => None,
        }) else {
            return Ok(None);
        };
        let opened = self
            .steps
            .at_rest
            .open_step(&lease.id, EFFECT_STEP, &result)
            .map_err(|reason| StoreError::Backend(reason.into()))?;
        Ok(Some(Bytes::from(opened.into_owned())))
    }
}
