//! [`Run`]: a held run whose work is done in another language, ended with
//! JSON.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::outbox::Message;
use idem::step::{Park, Retry, Skip, StepCtx};
use idem::{
    Begun, Context, FailureClass, Fingerprint, HeldRun, LeaseLost, OpenStep, RecordId, RunError,
    StepStart,
};
use parking_lot::Mutex;
use serde_json::value::RawValue;

use crate::error::{EngineError, HandlerFailure};
use crate::local::Local;
use crate::store::AnyStore;

/// What a claim found: a run to do, or a stored result.
#[derive(Debug)]
pub enum Begin {
    /// The key is this caller's to run.
    Run(Run),
    /// The key ran before: its stored result, the JSON as stored.
    Replayed(Vec<u8>),
}

impl Local {
    /// Claims `scope`/`key` (with `fingerprint`, JSON, if given), waiting
    /// up to `wait` for a duplicate in flight (`None`: the engine's
    /// default).
    pub async fn begin(
        self: &Arc<Self>,
        scope: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
        wait: Option<Duration>,
    ) -> Result<Begin, EngineError> {
        let id = RecordId::parse(scope, key)?;
        let fingerprint = fingerprint
            .map(Fingerprint::of_json)
            .transpose()
            .map_err(|e| EngineError::Json {
                what: "the fingerprint",
                reason: e.to_string(),
            })?;
        let begun = self
            .idem()
            .begin::<Box<RawValue>, Infallible>(&id, fingerprint, wait)
            .await?;
        Ok(match begun {
            Begun::Held(held) => Begin::Run(Run::new(Arc::clone(self), held)),
            Begun::Replayed(value) => Begin::Replayed(value.get().as_bytes().to_vec()),
        })
    }
}

/// A run's result as a binding hands it over: the JSON, or why the
/// value is not JSON (its language's encoder refused it).
pub fn result_of(json: Option<Vec<u8>>, unencodable: Option<String>) -> Result<Vec<u8>, String> {
    match (json, unencodable) {
        (_, Some(reason)) => Err(reason),
        (Some(json), None) => Ok(json),
        (None, None) => Err("no result was given".to_owned()),
    }
}

/// What [`Run::fail`] recorded.
#[derive(Debug, Clone, Copy)]
pub struct Failed {
    /// How it was recorded (a retryable failure past the attempt limit is
    /// terminal).
    pub class: FailureClass,
    /// The attempt that failed.
    pub attempt: u32,
    /// For a retryable failure, the backoff before the next attempt.
    pub retry_after: Option<Duration>,
}

/// What a step in doubt does: see [`idem::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPolicy {
    /// Run it again, with the same downstream key.
    Retry,
    /// Do not run it; it answers "skipped".
    Skip,
    /// Park the record as failed (outcome unknown) until an operator
    /// resolves it.
    Park,
}

impl std::str::FromStr for StepPolicy {
    type Err = EngineError;

    /// `retry`, `skip` or `park`.
    fn from_str(policy: &str) -> Result<Self, EngineError> {
        match policy {
            "retry" => Ok(StepPolicy::Retry),
            "skip" => Ok(StepPolicy::Skip),
            "park" => Ok(StepPolicy::Park),
            other => Err(EngineError::Config(format!(
                "step policy {other:?}: use \"retry\", \"skip\" or \"park\""
            ))),
        }
    }
}

/// A run in progress: its lease is held (the heartbeat on the engine's
/// runtime) until it is ended with [`complete`](Self::complete),
/// [`fail`](Self::fail) or [`release`](Self::release), once; share it
/// (`Arc`) between the calls of a binding. Dropped without that, the lease
/// runs out and the key is taken over, as after a crash.
pub struct Run {
    local: Arc<Local>,
    held: Mutex<Option<Box<HeldRun<AnyStore>>>>,
    ctx: Context,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("fence", &self.ctx.fence())
            .field("attempt", &self.ctx.attempt())
            .finish_non_exhaustive()
    }
}

impl Run {
    pub(crate) fn new(local: Arc<Local>, held: Box<HeldRun<AnyStore>>) -> Self {
        let ctx = held.context().clone();
        Self {
            local,
            held: Mutex::new(Some(held)),
            ctx,
        }
    }

    /// What the work is told about its run, and its steps: a handle
    /// that stays usable while another call ends the run.
    pub fn context(&self) -> RunContext {
        RunContext::new(Arc::clone(&self.local), self.ctx.clone())
    }

    /// The engine the run was begun on, if this is the process that
    /// began it (`Err` in a forked child: the parent's runtime has no
    /// threads there).
    pub fn local(&self) -> Result<&Arc<Local>, EngineError> {
        here(&self.local)
    }

    fn take(&self) -> Result<Box<HeldRun<AnyStore>>, EngineError> {
        here(&self.local)?;
        self.held
            .lock()
            .take()
            .ok_or_else(|| EngineError::Config("the run has already ended".to_owned()))
    }

    /// Ends the run with its result: stored, retried while the store is
    /// away for up to a lease, and replayed to every duplicate.
    ///
    /// `result` is the JSON, or why the handler's language could not
    /// encode the value. The work has run by now, so a result that cannot
    /// be stored (not JSON, over the size limit) is recorded as a terminal
    /// failure saying why, and the key is never run again.
    pub async fn complete(&self, result: Result<Vec<u8>, String>) -> Result<(), EngineError> {
        let held = self.take()?;
        let raw = result.and_then(|bytes| {
            let text = String::from_utf8(bytes).map_err(|e| e.to_string())?;
            RawValue::from_string(text).map_err(|e| e.to_string())
        });
        match raw {
            Ok(raw) => {
                held.complete::<_, Infallible>(raw).await?;
                Ok(())
            }
            Err(reason) => {
                let failure = HandlerFailure {
                    message: format!("the result cannot be stored as JSON: {reason}"),
                    class: FailureClass::Terminal,
                };
                match held.fail(failure).await {
                    RunError::Handler { .. } => Err(json("the result", reason)),
                    other => Err(other.into()),
                }
            }
        }
    }

    /// Ends the run with the handler's failure: a retryable one frees the
    /// key for the next delivery, a terminal one is stored and replayed.
    pub async fn fail(&self, failure: HandlerFailure) -> Result<Failed, EngineError> {
        let held = self.take()?;
        match held.fail(failure).await {
            RunError::Handler {
                class,
                attempt,
                retry_after,
                ..
            } => Ok(Failed {
                class,
                attempt,
                retry_after,
            }),
            other => Err(other.into()),
        }
    }

    /// Ends the run with nothing recorded: the key is free at once.
    pub async fn release(&self) -> Result<(), EngineError> {
        let held = self.take()?;
        held.release().await.map_err(|e| match e {
            idem::StoreError::LeaseLost => EngineError::LeaseLost,
            other => EngineError::Store(other),
        })
    }
}

/// What the work is told about its run, and its journaled steps; from
/// [`Run::context`].
#[derive(Debug, Clone)]
pub struct RunContext {
    local: Arc<Local>,
    ctx: Context,
}

impl RunContext {
    pub(crate) fn new(local: Arc<Local>, ctx: Context) -> Self {
        Self { local, ctx }
    }

    /// The run's fencing number (`None` when running unguarded).
    pub fn fence(&self) -> Option<u64> {
        self.ctx.fence()
    }

    /// Which attempt of the key this is (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.ctx.attempt()
    }

    /// Whether this run took the key over from a worker whose lease ran
    /// out.
    pub fn is_takeover(&self) -> bool {
        self.ctx.is_takeover()
    }

    /// Whether the lease is known lost (the heartbeat's last confirmed
    /// deadline has passed, or the record moved on).
    pub fn is_lease_lost(&self) -> bool {
        self.ctx.is_lease_lost()
    }

    /// `Err` once the lease is known lost: read from the heartbeat's last
    /// confirmed deadline and the clock, so a stalled process finds out
    /// before its next write.
    pub fn check(&self) -> Result<(), EngineError> {
        self.ctx
            .ensure_lease()
            .map_err(|LeaseLost| EngineError::LeaseLost)
    }

    /// The fence, checked first ([`check`](Self::check)); `Err` when
    /// running unguarded.
    pub fn checked_fence(&self) -> Result<u64, EngineError> {
        self.ctx
            .checked_fence()
            .map_err(|LeaseLost| EngineError::LeaseLost)
    }

    /// Sends a message through the engine's outbox
    /// ([`EngineOptions::outbox`](crate::EngineOptions::outbox); over a
    /// remote `idem serve`, the server's): held
    /// until the run ends, stored with its completion, sent after it, and
    /// never again for a duplicate that is replayed (see
    /// [`Context::send`]). `headers` travel with it; the message's id (a
    /// UUIDv7, returned) is the broker's deduplication id and the
    /// `Idempotency-Key` a consumer downstream keys on.
    pub fn send(
        &self,
        destination: &str,
        payload: Vec<u8>,
        headers: Vec<(String, String)>,
    ) -> Result<String, EngineError> {
        let message = headers.into_iter().fold(
            Message::new(destination, payload),
            |message, (name, value)| message.header(name, value),
        );
        let id = message.id().to_owned();
        self.ctx.send(message)?;
        Ok(id)
    }

    /// The engine the run was begun on, if this is the process that
    /// began it (see [`Run::local`]).
    pub fn local(&self) -> Result<&Arc<Local>, EngineError> {
        here(&self.local)
    }

    /// Begins the journaled step `name` (see [`Context::begin_step`]).
    pub async fn begin_step(
        &self,
        name: &str,
        policy: StepPolicy,
    ) -> Result<StepBegun, EngineError> {
        self.local()?;
        let start = match policy {
            StepPolicy::Retry => self.ctx.begin_step(name, Retry).await?,
            StepPolicy::Skip => self.ctx.begin_step(name, Skip).await?,
            StepPolicy::Park => self.ctx.begin_step(name, Park).await?,
        };
        Ok(match start {
            StepStart::Done(result) => StepBegun::Done(result.map(|json| json.to_vec())),
            StepStart::Open(open) => StepBegun::Open(Box::new(Step {
                ctx: open.ctx().clone(),
                open: Mutex::new(Some(open)),
                run: self.clone(),
            })),
        })
    }
}

/// What [`RunContext::begin_step`] found.
#[derive(Debug)]
pub enum StepBegun {
    /// Finished before: its journaled result (JSON), or `None` if it was
    /// skipped in doubt. The work must not run.
    Done(Option<Vec<u8>>),
    /// The step is this run's to do: run the work with the step's key,
    /// then [`Step::finish`].
    Open(Box<Step>),
}

/// A step begun and not yet journaled; share it (`Arc`) between a
/// binding's calls.
#[derive(Debug)]
pub struct Step {
    ctx: StepCtx,
    open: Mutex<Option<OpenStep>>,
    run: RunContext,
}

impl Step {
    /// What the step's work is given: its downstream key, fence, and
    /// whether it is in doubt.
    pub fn ctx(&self) -> &StepCtx {
        &self.ctx
    }

    /// The run's engine, in the process that began it.
    pub fn local(&self) -> Result<&Arc<Local>, EngineError> {
        self.run.local()
    }

    /// Journals `result` (JSON) as the step's result, once.
    pub async fn finish(&self, result: Vec<u8>) -> Result<(), EngineError> {
        self.local()?;
        serde_json::from_slice::<&RawValue>(&result).map_err(|e| json("the step's result", e))?;
        let open =
            self.open.lock().take().ok_or_else(|| {
                EngineError::Config("the step has already been finished".to_owned())
            })?;
        self.run.ctx.finish_step(open, Bytes::from(result)).await?;
        Ok(())
    }
}

fn here(local: &Arc<Local>) -> Result<&Arc<Local>, EngineError> {
    if local.pid == std::process::id() {
        Ok(local)
    } else {
        Err(EngineError::OtherProcess {
            began_in: local.pid,
        })
    }
}

fn json(what: &'static str, error: impl std::fmt::Display) -> EngineError {
    EngineError::Json {
        what,
        reason: error.to_string(),
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.local.pid != std::process::id() {
            // A forked child's copy of its parent's run: the parent's to
            // end. Dropping it would touch the parent's runtime, whose
            // threads are not here (see `Engine::here`).
            std::mem::forget(self.held.get_mut().take());
        }
    }
}
