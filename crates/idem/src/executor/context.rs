//! What a handler is told about its run and can do in it: [`Context`],
//! its [`Heartbeats`], and its journaled steps ([`Context::step`]; the
//! step types live in [`crate::step`]).

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::machine::LeaseLost;
use crate::metrics as m;
use crate::outbox::{Message, Outgoing, SendError};
use crate::record::{Lease, StepBegin};
use crate::step::{
    check_step_name, downstream_key, with_retries, InDoubt, StepCtx, StepError, StepRun,
};
use crate::store::{DynStepJournal, StoreError};

/// What the heartbeat has found of a run's lease, shared with the run's
/// [`Context`] through one watch channel (a channel costs a run its
/// creation and the wake-up of its receivers when dropped).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Held {
    /// The lease is known or feared lost.
    pub(super) lost: bool,
    /// Extensions the store has confirmed.
    pub(super) beats: u64,
    /// When the lease as last confirmed runs out, measured from when the
    /// confirming request was sent; `None` when running unguarded.
    pub(super) until: Option<Instant>,
}

impl Held {
    /// A lease claimed by a request sent at `sent`, held for `lease`.
    pub(super) fn claimed(sent: Instant, lease: Duration) -> Self {
        Self {
            until: Some(super::deadline(sent, lease)),
            ..Self::default()
        }
    }

    /// Lost as flagged, or run out by the clock: a handler resuming after
    /// a stall is polled before the heartbeat that would flag it.
    fn is_lost(&self) -> bool {
        self.lost || self.until.is_some_and(|until| Instant::now() >= until)
    }
}

/// What a handler is told about its run.
#[derive(Debug, Clone)]
pub struct Context {
    pub(super) lease: Option<Lease>,
    pub(super) held: watch::Receiver<Held>,
    pub(crate) steps: Arc<StepRun>,
    pub(crate) outgoing: Arc<Outgoing>,
}

impl Context {
    /// Sends `message` through the executor's outbox ([`crate::outbox`]):
    /// held until the run ends, stored with its completion in the same
    /// write, and dispatched only after it — so a run that fails or is
    /// taken over sends nothing, and a duplicate delivery replays the run
    /// and re-dispatches, never re-runs. Refused (a typed error, nothing
    /// held) when the executor has no outbox, the message is malformed,
    /// or the run's messages would take more than
    /// [`MAX_MESSAGES_BYTES`](crate::outbox::MAX_MESSAGES_BYTES).
    ///
    /// Send from the handler itself, before it returns (a send after the
    /// run ended is refused with [`SendError::Ended`]), and not from
    /// inside a [`step`](Self::step)'s work: a step finished by an earlier
    /// attempt is replayed from its journal without running again, so a
    /// message sent there would be missing from the attempt that completes.
    ///
    /// In a run with no claim (fail-open with the store down) there is
    /// nothing to store the messages with: they are sent when the handler
    /// returns `Ok`, at least once, as the rest of such a run is.
    pub fn send(&self, message: Message) -> Result<(), SendError> {
        self.outgoing.push(message)
    }

    /// The lease held, or `None` when running unguarded (fail-open).
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// This run's fencing number, to pass to downstream writes that can
    /// reject an older holder's writes. `None` when unguarded.
    pub fn fence(&self) -> Option<u64> {
        self.lease.as_ref().map(|l| l.fence)
    }

    /// Which attempt this is (1 for the first; 0 when unguarded).
    pub fn attempt(&self) -> u32 {
        self.lease.as_ref().map_or(0, |l| l.attempt)
    }

    /// Whether this run took over from a worker whose lease expired: an
    /// earlier attempt may have partly run.
    pub fn is_takeover(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| l.takeover)
    }

    /// Whether the lease is known to be lost (taken over, or not
    /// confirmed by a heartbeat before it ran out). Reads the clock, so it
    /// is right even when the heartbeat has not run for a while (a
    /// blocking call, a paused or starved process).
    pub fn is_lease_lost(&self) -> bool {
        self.held.borrow().is_lost()
    }

    /// Check this before an irreversible step: `Err` once the lease is
    /// known to be lost, when another worker may be running the same work.
    pub fn ensure_lease(&self) -> Result<(), LeaseLost> {
        if self.is_lease_lost() {
            Err(LeaseLost)
        } else {
            Ok(())
        }
    }

    /// The fence to pass to a write that can refuse an older holder's,
    /// checked first: [`ensure_lease`](Self::ensure_lease) and
    /// [`fence`](Self::fence) in one call, for code that runs only under a
    /// lease. `Err` once the lease is known to be lost, and when the run is
    /// unguarded (fail-open with the store down: there is no lease, so
    /// nothing to fence with).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// # let idem = idem::Idempotency::builder(idem::MemoryStore::new()).build()?;
    /// # let id = idem::RecordId::parse("payments", "order-7")?;
    /// let receipt = idem
    ///     .run(&id, None, |ctx| async move {
    ///         let fence = ctx.checked_fence()?;
    ///         Ok::<_, idem::LeaseLost>(format!("written under fence {fence}"))
    ///     })
    ///     .await?;
    /// assert_eq!(receipt.value(), "written under fence 1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn checked_fence(&self) -> Result<u64, LeaseLost> {
        self.ensure_lease()?;
        self.fence().ok_or(LeaseLost)
    }

    /// Resolves when the lease is lost (never, if it is not).
    pub async fn lease_lost(&self) {
        let mut held = self.held.clone();
        if held.wait_for(|h| h.lost).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// A stream of the heartbeat's confirmed extensions: each call to
    /// [`Heartbeats::next`] resolves after the store next confirms that
    /// this run's lease was extended. It never resolves once the lease is
    /// lost, or when running unguarded.
    ///
    /// Brokers use this to tell their own redelivery timer that the work
    /// is still alive (JetStream in-progress acks, SQS visibility), so the
    /// broker keeps the message for exactly as long as the claim is held.
    pub fn heartbeats(&self) -> Heartbeats {
        let mut held = self.held.clone();
        let seen = held.borrow_and_update().beats;
        Heartbeats { held, seen }
    }
}

/// What [`Context::begin_step`] found.
#[derive(Debug)]
pub enum StepStart {
    /// The step finished on an earlier attempt: its journaled result
    /// (JSON), or `None` if it was skipped in doubt under
    /// [`Skip`](crate::step::Skip). The work must not run.
    Done(Option<Bytes>),
    /// The step is this run's to do: run the work, then
    /// [`finish_step`](Context::finish_step).
    Open(OpenStep),
}

/// A step begun by [`Context::begin_step`] and not yet journaled.
#[derive(Debug)]
pub struct OpenStep {
    ctx: StepCtx,
    /// Journaled under a lease (not an unguarded run's step).
    guarded: bool,
}

impl OpenStep {
    /// What the step's work is given: its downstream key, fence, and
    /// whether it is in doubt.
    pub fn ctx(&self) -> &StepCtx {
        &self.ctx
    }
}

/// Confirmed lease extensions of one run; see [`Context::heartbeats`].
#[derive(Debug)]
pub struct Heartbeats {
    held: watch::Receiver<Held>,
    /// The extensions counted when this last resolved.
    seen: u64,
}

impl Heartbeats {
    /// Resolves after the next confirmed extension while the lease is
    /// held; pending forever once it is lost or the run has ended.
    pub async fn next(&mut self) {
        loop {
            if self.held.changed().await.is_err() {
                return std::future::pending().await;
            }
            let now = *self.held.borrow_and_update();
            if !now.lost && now.beats != self.seen {
                self.seen = now.beats;
                return;
            }
        }
    }
}

impl Context {
    /// Runs `work` as the journaled step `name` of this record; see the
    /// [module docs](crate::step).
    ///
    /// - A step that finished on an earlier attempt returns its journaled
    ///   result and `work` does not run.
    /// - Otherwise the step is marked started, `work` runs with a
    ///   [`StepCtx`] carrying the step's downstream key, and an `Ok` result
    ///   is journaled (as JSON) before it is returned.
    /// - A step in doubt follows `policy`: [`Retry`](crate::step::Retry),
    ///   [`Skip`](crate::step::Skip) or [`Park`](crate::step::Park).
    ///
    /// Names must be unique within a handler and stable across releases
    /// of your code: the journal is keyed by them. When the run is
    /// unguarded (fail-open, store down) `work` simply runs.
    ///
    /// The step runs in an `idem.step` span (INFO, inside the run's
    /// `idem.run`) naming the step and saying whether it was replayed
    /// from the journal and, on failure, why.
    pub async fn step<P, T, E, F, Fut>(
        &self,
        name: &str,
        policy: P,
        work: F,
    ) -> Result<P::Output<T>, StepError<E>>
    where
        P: InDoubt,
        T: Serialize + DeserializeOwned,
        F: FnOnce(StepCtx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = tracing::info_span!(
            "idem.step",
            step = name,
            policy = P::NAME,
            replayed = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        let result = self
            .run_step(name, policy, work)
            .instrument(span.clone())
            .await;
        if let Err(error) = &result {
            span.record("error", tracing::field::display(error));
        }
        result
    }

    async fn run_step<P, T, E, F, Fut>(
        &self,
        name: &str,
        policy: P,
        work: F,
    ) -> Result<P::Output<T>, StepError<E>>
    where
        P: InDoubt,
        T: Serialize + DeserializeOwned,
        F: FnOnce(StepCtx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let open = match self.begin_step(name, policy).await? {
            StepStart::Done(result) => return replay::<P, T, E>(name, result.as_deref()),
            StepStart::Open(open) => open,
        };
        let value = work(open.ctx.clone())
            .await
            .map_err(|error| StepError::Failed {
                step: name.to_owned(),
                error,
            })?;
        let encoded = serde_json::to_vec(&value).map_err(|e| StepError::Encode {
            step: name.to_owned(),
            reason: e.to_string(),
        })?;
        self.finish_step(open, Bytes::from(encoded)).await?;
        Ok(P::ran(value))
    }

    /// The first half of [`step`](Self::step), for work that is not a
    /// closure (another language's callback, a promise): checks the name,
    /// refuses a name already begun in this run, and asks the journal.
    ///
    /// - [`StepStart::Done`]: the step finished (or was skipped in doubt
    ///   under [`Skip`](crate::step::Skip)) before; do not run it.
    /// - [`StepStart::Open`]: run the work with the [`StepCtx`] it
    ///   carries, then journal its result with
    ///   [`finish_step`](Self::finish_step).
    ///
    /// A step in doubt follows `policy` as in [`step`](Self::step).
    pub async fn begin_step<P: InDoubt, E>(
        &self,
        name: &str,
        _policy: P,
    ) -> Result<StepStart, StepError<E>> {
        let step = || name.to_owned();
        check_step_name(name).map_err(|problem| StepError::InvalidName {
            name: name.to_owned(),
            problem,
        })?;
        if !self.steps.begun.lock().insert(name.to_owned()) {
            return Err(StepError::DuplicateName { step: step() });
        }
        let Some(lease) = self.lease() else {
            // Unguarded: nothing to journal under.
            return Ok(StepStart::Open(OpenStep {
                ctx: StepCtx {
                    key: downstream_key(&self.steps.id, name),
                    name: step(),
                    attempt: 0,
                    fence: None,
                    in_doubt: false,
                },
                guarded: false,
            }));
        };
        let Some(journal) = self.steps.journal.as_deref() else {
            return Err(StepError::Unsupported { step: step() });
        };
        if self.is_lease_lost() {
            return Err(StepError::LeaseLost { step: step() });
        }
        let begun = with_retries(lease.id.logged(self.steps.log_keys), name, || {
            m::timed(m::OP_STEP_BEGIN, journal.begin_step(lease, name))
        })
        .await
        .map_err(|e| store_error(name, e))?;
        let in_doubt = match begun {
            StepBegin::Done(result) => {
                tracing::Span::current().record("replayed", true);
                crate::metrics::count(crate::metrics::STEPS, &[("result", "replayed")]);
                if !result.is_empty() {
                    let opened = self
                        .steps
                        .at_rest
                        .open_step(&lease.id, name, &result)
                        .map_err(|reason| StepError::Decode {
                            step: step(),
                            reason,
                        })?;
                    // An unsealed result is replayed as journaled, uncopied.
                    let opened = match opened {
                        Cow::Borrowed(_) => result,
                        Cow::Owned(json) => Bytes::from(json),
                    };
                    return Ok(StepStart::Done(Some(opened)));
                }
                if P::skipped::<()>().is_none() {
                    return Err(StepError::Decode {
                        step: step(),
                        reason: format!(
                            "an earlier attempt skipped it in doubt, and its policy is now {}",
                            P::NAME
                        ),
                    });
                }
                return Ok(StepStart::Done(None));
            }
            StepBegin::Fresh => false,
            StepBegin::InDoubt { attempt } => {
                crate::metrics::count(crate::metrics::STEPS_IN_DOUBT, &[("policy", P::NAME)]);
                tracing::warn!(
                    scope = %lease.id.scope(),
                    key = %lease.id.logged(self.steps.log_keys),
                    step = name,
                    started_by = attempt,
                    policy = P::NAME,
                    "step in doubt: an earlier attempt started it and never finished"
                );
                if P::skipped::<()>().is_some() {
                    self.finish(journal, lease, name, Bytes::new()).await?;
                    return Ok(StepStart::Done(None));
                }
                if P::PARKS {
                    *self.steps.parked.lock() = Some(crate::step::parked_reason(name, attempt));
                    return Err(StepError::Parked {
                        step: step(),
                        attempt,
                    });
                }
                true
            }
        };
        Ok(StepStart::Open(OpenStep {
            ctx: StepCtx {
                key: downstream_key(&lease.id, name),
                name: step(),
                attempt: lease.attempt,
                fence: Some(lease.fence),
                in_doubt,
            },
            guarded: true,
        }))
    }

    /// The second half of [`step`](Self::step): journals `result` (the
    /// work's JSON) as the result of the step `open` began, so no later
    /// attempt runs it again. A result over the journal's limit is
    /// refused ([`StepError::Encode`]); an unguarded step journals
    /// nothing.
    pub async fn finish_step<E>(&self, open: OpenStep, result: Bytes) -> Result<(), StepError<E>> {
        let name = open.ctx.name.as_str();
        let limit = self.steps.max_result_bytes;
        if result.len() > limit {
            return Err(StepError::Encode {
                step: name.to_owned(),
                reason: format!("{} bytes exceeds the limit of {limit} bytes", result.len()),
            });
        }
        if !open.guarded {
            return Ok(());
        }
        let (Some(lease), Some(journal)) = (self.lease(), self.steps.journal.as_deref()) else {
            return Err(StepError::Unsupported {
                step: name.to_owned(),
            });
        };
        let sealed = self.steps.at_rest.seal_step(&lease.id, name, result);
        self.finish(journal, lease, name, sealed).await?;
        tracing::Span::current().record("replayed", false);
        crate::metrics::count(crate::metrics::STEPS, &[("result", "executed")]);
        Ok(())
    }

    async fn finish<E>(
        &self,
        journal: &dyn DynStepJournal,
        lease: &Lease,
        name: &str,
        result: Bytes,
    ) -> Result<(), StepError<E>> {
        with_retries(lease.id.logged(self.steps.log_keys), name, || {
            m::timed(
                m::OP_STEP_FINISH,
                journal.finish_step(lease, name, result.clone()),
            )
        })
        .await
        .map_err(|e| store_error(name, e))
    }
}

fn store_error<E>(step: &str, error: StoreError) -> StepError<E> {
    match error {
        StoreError::LeaseLost => StepError::LeaseLost {
            step: step.to_owned(),
        },
        source => StepError::Store {
            step: step.to_owned(),
            source,
        },
    }
}

/// A finished step's journaled result (`None`: skipped in doubt), as
/// the policy's output.
fn replay<P: InDoubt, T: DeserializeOwned, E>(
    name: &str,
    result: Option<&[u8]>,
) -> Result<P::Output<T>, StepError<E>> {
    let decode = |reason: String| StepError::Decode {
        step: name.to_owned(),
        reason,
    };
    match result {
        None => P::skipped::<T>()
            .ok_or_else(|| decode(format!("it was skipped, and its policy is {}", P::NAME))),
        Some(result) => serde_json::from_slice(result)
            .map(P::ran)
            .map_err(|e| decode(e.to_string())),
    }
}
