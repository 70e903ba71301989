//! A run whose effect as a whole is in doubt: a handler that passed the
//! work on (a request forwarded, a call made) and lost the answer cannot
//! say whether it took effect. It marks the run's effect in doubt in the
//! step journal before failing with an unknown outcome; someone who can
//! find out — an operator, or a reconciler that asks the service — then
//! settles it with
//! [`StepJournal::resolve_step`](crate::StepJournal::resolve_step) on that
//! attempt's mark ([`effect_mark`]), atomically with the record's release.
//! The mark names its attempt by its fence, which grows with every claim
//! of the key, across records too, so a finding about one attempt cannot
//! settle a later one (a slow "not applied" arriving after the key ran
//! again and lost its answer again, or after the record was deleted and
//! claimed anew):
//!
//! - [`Resolution::Applied`](crate::Resolution::Applied) with the run's
//!   outcome: the next attempt finds it with
//!   [`Context::settled_effect`] and completes with it, running nothing;
//! - [`Resolution::NotApplied`](crate::Resolution::NotApplied): the mark
//!   is removed and the next attempt runs the work.

use bytes::Bytes;

use super::Context;
use crate::record::{StepEntry, StepState};
use crate::step::with_retries;
use crate::store::StoreError;

/// What the journal entries that stand for a run's whole effect are
/// called, followed by `.` and the attempt's fence (reserved: user step
/// names cannot start with `$`). An entry's result, once settled applied,
/// is the run's outcome as the handler would have returned it, encoded by
/// the handler's owner (the HTTP layer: the stored response).
pub const EFFECT_STEP: &str = "$effect";

/// The mark of the effect of the attempt holding `fence`:
/// `$effect.<fence>`.
pub fn effect_mark(fence: u64) -> String {
    format!("{EFFECT_STEP}.{fence}")
}

/// The fence of the attempt whose effect mark `name` is, if it is one.
pub fn effect_mark_fence(name: &str) -> Option<u64> {
    name.strip_prefix(EFFECT_STEP)?
        .strip_prefix('.')?
        .parse()
        .ok()
}

/// The effect mark in doubt in `journal` (started, not settled) of the
/// latest attempt: the one a finding about the key settles.
pub fn effect_in_doubt_of(journal: &[StepEntry]) -> Option<&str> {
    journal
        .iter()
        .filter(|entry| matches!(entry.state, StepState::Started { .. }))
        .filter_map(|entry| Some((effect_mark_fence(&entry.name)?, entry.name.as_str())))
        .max()
        .map(|(_, name)| name)
}

impl Context {
    /// Marks this run's effect in doubt (its attempt's [`effect_mark`]
    /// started), for a handler about to fail with an unknown outcome, so
    /// the record can be settled later instead of only released by hand.
    /// `false` when there is nothing to mark under: the run is unguarded or
    /// the store keeps no step journal.
    pub async fn effect_in_doubt(&self) -> Result<bool, StoreError> {
        let (Some(lease), Some(journal)) = (self.lease(), self.steps.journal.as_deref()) else {
            return Ok(false);
        };
        let mark = effect_mark(lease.fence);
        with_retries(lease.id.logged(self.steps.log_keys), &mark, || {
            journal.begin_step(lease, &mark)
        })
        .await?;
        Ok(true)
    }

    /// On an attempt after the first: the outcome settled for an effect an
    /// earlier attempt left in doubt (its mark resolved applied), opened
    /// from its seal. `None` otherwise — and on a first attempt, without
    /// reading anything.
    pub async fn settled_effect(&self) -> Result<Option<Bytes>, StoreError> {
        let (Some(lease), Some(journal)) = (self.lease(), self.steps.journal.as_deref()) else {
            return Ok(None);
        };
        if lease.attempt <= 1 {
            return Ok(None);
        }
        let steps = with_retries(lease.id.logged(self.steps.log_keys), "effect marks", || {
            journal.steps(&lease.id)
        })
        .await?;
        let Some((name, result)) = steps.into_iter().find_map(|entry| match entry.state {
            StepState::Done { result }
                if effect_mark_fence(&entry.name).is_some() && !result.is_empty() =>
            {
                Some((entry.name, result))
            }
            _ => None,
        }) else {
            return Ok(None);
        };
        let opened = self
            .steps
            .at_rest
            .open_step(&lease.id, &name, &result)
            .map_err(|reason| StoreError::Backend(reason.into()))?;
        Ok(Some(Bytes::from(opened.into_owned())))
    }
}
