//! Parked runs settled by asking the service. A consumer's run parks when
//! a step with the [`Park`](idem::step::Park) policy is found in doubt: an
//! earlier attempt started it (a shipment booked, a call made) and never
//! recorded how it ended, so the run cannot tell whether running it again
//! would do it twice. Without a [`Reconciler`] the delivery is
//! dead-lettered and the key waits for a person (`idem resolve`). With
//! one, the consumer first asks it whether the step took effect, and
//! settles the step on what it hears:
//!
//! - [`Finding::Applied`] with the step's result (the JSON the step would
//!   have returned): journaled as the step's result; the delivery is
//!   retried and the run resumes past the step, which does not run;
//! - [`Finding::NotApplied`]: the step's mark is removed; the delivery is
//!   retried and the step runs;
//! - [`Finding::Unknown`] (or no answer within the timeout): the key stays
//!   parked for a person, and the delivery is dead-lettered as before,
//!   saying what the reconciler said.
//!
//! Settling is the store's [`resolve_step`](idem::StepJournal::resolve_step),
//! atomic with the record's release, so two deliveries reconciling at once
//! settle the step once. [`Consumer::sweep_parked`] asks about the parked
//! keys of the consumer's scope with no delivery in hand, on a schedule.
//! Every finding is logged and counted ([`RECONCILIATIONS`]).
//!
//! Answer [`Finding::NotApplied`] only when the step can no longer take
//! effect: it never reached the service, or a late copy of it would be
//! refused (the service deduplicates on the step's downstream key,
//! [`Doubt::downstream_key`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::{
    Codec, Idempotency, ListQuery, ListRecords, Record, RecordId, Resolution, Resolved, State,
    StateKind, StepEntry, StepState, Store,
};
use tokio::sync::Semaphore;

use crate::Consumer;

/// Reconciliations, by `consumer`, `finding` (`applied`, `not_applied`,
/// `unknown`, `none`) and `why`: `answered` (settled), `raced` (settled
/// meanwhile by another delivery), and for unknown ones `said`,
/// `timeout`, `busy`, `unmarked`, `gone`, `raced`, `unjournaled`, `store`.
pub const RECONCILIATIONS: &str = "idem_consumer_reconciliations_total";

/// How long a reconciler may take before its finding counts as unknown
/// (and, as long again, how long a delivery waits for its turn to ask).
pub const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(5);

/// How many reconciliations may run at once; a delivery that finds them
/// all busy waits its turn for up to the reconcile timeout, then is
/// dead-lettered as before, without asking.
pub const DEFAULT_MAX_RECONCILING: usize = 16;

/// The step a reconciler is asked about.
#[derive(Debug, Clone)]
pub struct Doubt {
    /// The key's record id (the consumer's scope and the key).
    pub id: RecordId,
    /// The step in doubt.
    pub step: String,
    /// The latest attempt that marked it started and recorded no end
    /// (the attempt that found it in doubt and parked marks it too,
    /// without running it).
    pub attempt: u32,
    /// The key the step's work gave the service
    /// ([`idem::step::downstream_key`], from the id as stored): what to
    /// look the effect up by.
    pub downstream_key: String,
    /// The delivery's payload, when asked on a delivery (`None` in a
    /// [sweep](Consumer::sweep_parked)).
    pub payload: Option<Bytes>,
}

/// What a reconciler found out.
#[derive(Debug, Clone, PartialEq)]
pub enum Finding {
    /// The step took effect, and this is its result, as the step would
    /// have returned it (its JSON): journaled, and the run resumes past it.
    Applied(serde_json::Value),
    /// The step did not take effect: it runs when the run resumes.
    NotApplied,
    /// It cannot tell; why, for the log and the dead-letter reason. The
    /// key stays parked for a person.
    Unknown(String),
}

/// A boxed finding, for [`Reconciler`].
pub type BoxFinding = Pin<Box<dyn Future<Output = Finding> + Send>>;

/// Asks the service whether a step in doubt took effect. Any
/// `Fn(Doubt) -> impl Future<Output = Finding>` is one.
pub trait Reconciler: Send + Sync + 'static {
    /// Finds out about `doubt`'s step.
    fn reconcile(&self, doubt: Doubt) -> BoxFinding;
}

impl<F, Fut> Reconciler for F
where
    F: Fn(Doubt) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Finding> + Send + 'static,
{
    fn reconcile(&self, doubt: Doubt) -> BoxFinding {
        Box::pin(self(doubt))
    }
}

/// What asking about a parked key came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Settled (here, or meanwhile by another delivery or a person): the
    /// key's next delivery resumes the run.
    Yes,
    /// Left parked, and why.
    No(String),
}

/// A consumer's reconciler and its bounds.
#[derive(Clone)]
pub(crate) struct Reconciling {
    reconciler: Arc<dyn Reconciler>,
    pub(crate) timeout: Duration,
    pub(crate) slots: Arc<Semaphore>,
}

impl Reconciling {
    pub(crate) fn new(reconciler: Arc<dyn Reconciler>) -> Self {
        Self {
            reconciler,
            timeout: DEFAULT_RECONCILE_TIMEOUT,
            slots: Arc::new(Semaphore::new(DEFAULT_MAX_RECONCILING)),
        }
    }

    /// Asks about `id`'s step in doubt (the one its record's failure,
    /// `parked`, names, if the journal has it in doubt) and settles it on
    /// the finding.
    pub(crate) async fn settle<S: Store, C: Codec>(
        &self,
        consumer: &str,
        idem: &Idempotency<S, C>,
        id: &RecordId,
        parked: &str,
        payload: Option<Bytes>,
    ) -> Settled {
        let count = |finding: &'static str, why: &'static str| {
            metrics::counter!(RECONCILIATIONS, "consumer" => consumer.to_owned(),
                "finding" => finding, "why" => why)
            .increment(1);
        };
        let unsettled = |why: &'static str, detail: String| {
            count("unknown", why);
            tracing::warn!(consumer, %id, why, %detail, "parked run left for a person");
            Settled::No(detail)
        };
        let Some(journal) = idem.store().step_journal() else {
            return unsettled("unjournaled", "the store keeps no step journal".into());
        };
        let stored = idem.stored_id(id).into_owned();
        let (step, attempt) = match journal.steps(&stored).await {
            Ok(steps) => match in_doubt(&steps, idem::step::parked_step(parked).as_deref()) {
                Some(found) => found,
                None => {
                    return match now_parked(idem, &stored).await {
                        Now::Settled => {
                            count("none", "raced");
                            Settled::Yes
                        }
                        Now::Parked => unsettled(
                            "unmarked",
                            "parked with no step in doubt (by the handler's own failure)".into(),
                        ),
                        Now::Gone(why) => unsettled("gone", why),
                    };
                }
            },
            Err(error) => return unsettled("store", idem::error_chain(&error)),
        };
        let Ok(Ok(_slot)) = tokio::time::timeout(self.timeout, self.slots.acquire()).await else {
            return unsettled("busy", "no turn to reconcile within the timeout".into());
        };
        let doubt = Doubt {
            id: id.clone(),
            downstream_key: idem::step::downstream_key(&stored, &step),
            step: step.clone(),
            attempt,
            payload,
        };
        let finding = tokio::time::timeout(self.timeout, self.reconciler.reconcile(doubt))
            .await
            .unwrap_or_else(|_| Finding::Unknown(TIMED_OUT.into()));
        let (label, resolution) = match finding {
            Finding::Applied(result) => {
                let json = Bytes::from(result.to_string());
                let sealed = idem.at_rest().seal_step(&stored, &step, json);
                ("applied", Resolution::Applied(sealed))
            }
            Finding::NotApplied => ("not_applied", Resolution::NotApplied),
            Finding::Unknown(why) => {
                let said = if why == TIMED_OUT { "timeout" } else { "said" };
                return unsettled(said, format!("the reconciler could not tell: {why}"));
            }
        };
        match journal.resolve_step(&stored, &step, resolution).await {
            Ok(Resolved::Released) => {
                count(label, "answered");
                tracing::info!(consumer, %id, step, finding = label, "parked run reconciled");
                Settled::Yes
            }
            // Settled meanwhile by another delivery or a person, if the
            // record is still there: its journal decides the next run. A
            // record that expired meanwhile would run afresh, its journal
            // gone: that is for a person, not a retry.
            Ok(Resolved::NotParked | Resolved::StepNotInDoubt) => {
                match now_parked(idem, &stored).await {
                    Now::Settled => {
                        count(label, "raced");
                        Settled::Yes
                    }
                    Now::Parked => unsettled("raced", "still parked after settling".into()),
                    Now::Gone(why) => unsettled("gone", why),
                }
            }
            Err(error) => unsettled("store", idem::error_chain(&error)),
        }
    }
}

/// What a parked key's record is now.
enum Now {
    /// Live and no longer parked: settled.
    Settled,
    /// Still parked (or the store could not say).
    Parked,
    /// Expired or deleted, and why that settles nothing.
    Gone(String),
}

/// What `stored`'s record is now (read past the executor).
async fn now_parked<S: Store, C: Codec>(idem: &Idempotency<S, C>, stored: &RecordId) -> Now {
    match idem.store().peek(stored).await {
        Ok(Some(Record {
            state: State::Failed { failure },
            ..
        })) if failure.is_parked() => Now::Parked,
        Ok(Some(_)) => Now::Settled,
        Ok(None) => Now::Gone(
            "the record expired (or was deleted) before it was settled: its journal is gone, so \
             a retry would run every step again"
                .into(),
        ),
        Err(_) => Now::Parked,
    }
}

/// What a reconciler that did not answer in time is taken to have said.
const TIMED_OUT: &str = "no finding within the timeout";

/// The step in doubt in a parked run's journal: a user step (not a `$`
/// mark) started and never finished — `named` (the one the record's
/// failure names) if it is, else the one the latest attempt left.
fn in_doubt(journal: &[StepEntry], named: Option<&str>) -> Option<(String, u32)> {
    let started: Vec<(u32, &str)> = journal
        .iter()
        .filter(|entry| !entry.name.starts_with('$'))
        .filter_map(|entry| match entry.state {
            StepState::Started { attempt } => Some((attempt, entry.name.as_str())),
            StepState::Done { .. } => None,
        })
        .collect();
    started
        .iter()
        .find(|(_, name)| Some(*name) == named)
        .or_else(|| started.iter().max_by_key(|(attempt, _)| *attempt))
        .map(|(attempt, name)| ((*name).to_owned(), *attempt))
}

/// What a sweep of parked keys came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Parked keys found in the consumer's scope.
    pub parked: usize,
    /// Of those, settled: their next delivery resumes the run.
    pub settled: usize,
}

impl<S: Store + ListRecords, C: Codec> Consumer<S, C> {
    /// Asks the reconciler about up to `limit` parked keys of this
    /// consumer's scope, with no delivery in hand (the [`Doubt`] carries no
    /// payload), and settles each on its finding as a delivery would. Run
    /// it on a schedule, so keys whose deliveries were dead-lettered are
    /// settled for their redelivery. Nothing is asked without a
    /// reconciler, or when keys are hashed at rest (the service would be
    /// asked about the hash; deliveries still ask, with the key they
    /// carry).
    pub async fn sweep_parked(&self, limit: usize) -> Result<Sweep, idem::StoreError> {
        let mut sweep = Sweep::default();
        let idem = self.idempotency();
        let Some(reconciling) = self.reconciling() else {
            return Ok(sweep);
        };
        if idem.key_hasher().is_some() {
            return Ok(sweep);
        }
        let mut query = ListQuery::new(limit.clamp(1, 1000))
            .scope(self.scope().clone())
            .state(StateKind::Failed);
        while sweep.parked < limit {
            let page = idem.store().list(&query).await?;
            for (id, record) in &page.records {
                if sweep.parked == limit {
                    break;
                }
                if !matches!(&record.state, State::Failed { failure } if failure.is_parked()) {
                    continue;
                }
                sweep.parked += 1;
                let reason = match &record.state {
                    State::Failed { failure } => failure.message.as_str(),
                    _ => "",
                };
                let settled = reconciling
                    .settle(self.name(), idem, id, reason, None)
                    .await;
                if settled == Settled::Yes {
                    sweep.settled += 1;
                }
            }
            match page.next {
                Some(next) => query = query.after(next),
                None => break,
            }
        }
        Ok(sweep)
    }

    /// Runs [`sweep_parked`](Self::sweep_parked)`(limit)` every `every`
    /// (the first at once) on the current tokio runtime, logging what each
    /// pass settled, until the handle is dropped. A pass asks about the
    /// scope's first `limit` parked keys, so keys the service cannot tell
    /// about are asked again each pass (bounded by the reconciler's timeout
    /// and the reconciliations allowed at once).
    pub fn spawn_parked_sweep(&self, every: Duration, limit: usize) -> idem::PurgerHandle
    where
        S: Clone + 'static,
        C: 'static,
    {
        let consumer = self.clone();
        idem::spawn_every(every, move || {
            let consumer = consumer.clone();
            async move {
                match consumer.sweep_parked(limit).await {
                    Ok(sweep) if sweep.parked > 0 => tracing::info!(
                        consumer = consumer.name(),
                        parked = sweep.parked,
                        settled = sweep.settled,
                        "swept parked keys"
                    ),
                    Ok(_) => {}
                    Err(error) => tracing::warn!(
                        consumer = consumer.name(),
                        error = %idem::error_chain(&error),
                        "sweeping parked keys failed; trying again at the next pass"
                    ),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_in_doubt_is_the_latest_attempts_user_step() {
        let entry = |name: &str, state: StepState| StepEntry {
            name: name.into(),
            state,
        };
        let journal = [
            entry("$effect.7", StepState::Started { attempt: 3 }),
            entry("reserve", StepState::Done { result: "1".into() }),
            entry("ship", StepState::Started { attempt: 1 }),
            entry("notify", StepState::Started { attempt: 2 }),
        ];
        assert_eq!(in_doubt(&journal, None), Some(("notify".into(), 2)));
        assert_eq!(
            in_doubt(&journal, Some("ship")),
            Some(("ship".into(), 1)),
            "the step the failure names, when it is in doubt"
        );
        assert_eq!(
            in_doubt(&journal, Some("reserve")),
            Some(("notify".into(), 2))
        );
        assert_eq!(in_doubt(&journal[..2], None), None);
    }
}
