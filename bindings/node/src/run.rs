//! `Run` and `Step`: a held run and one of its journaled steps, ended
//! with JSON.

use std::sync::Arc;

use idem::{FailureClass, OpenStep, StepStart};
use idem_engine::{EngineError, HandlerFailure, Local, RunContext, StepPolicy};
use napi::bindgen_prelude::{Either3, Null};
use napi_derive::napi;
use parking_lot::Mutex;

use crate::errors::to_js;

/// A claimed run: its lease held by the engine's heartbeat until
/// `complete`, `fail` or `release`.
#[napi]
pub struct Run {
    run: Mutex<Option<idem_engine::Run>>,
    ctx: RunContext,
}

/// What `fail` recorded.
#[napi(object)]
pub struct Failed {
    /// How it was recorded: "retryable", "terminal" or "unknown".
    pub class: String,
    /// The attempt that failed.
    pub attempt: u32,
    /// For a retryable failure, the backoff before the next attempt.
    pub retry_after_ms: Option<f64>,
}

/// A journaled step begun and not yet finished: run the work with `key`,
/// then `finish` it with the result.
#[napi]
pub struct Step {
    open: Mutex<Option<OpenStep>>,
    ctx: RunContext,
    key: String,
    in_doubt: bool,
}

impl Run {
    pub(crate) fn new(run: idem_engine::Run) -> Self {
        let ctx = run.context();
        Self {
            run: Mutex::new(Some(run)),
            ctx,
        }
    }

    fn take(&self) -> Result<(idem_engine::Run, Arc<Local>), EngineError> {
        let local = Arc::clone(self.ctx.local()?);
        let run = self
            .run
            .lock()
            .take()
            .ok_or_else(|| EngineError::Config("the run has already ended".to_owned()))?;
        Ok((run, local))
    }
}

fn class_of(class: &str) -> Result<FailureClass, EngineError> {
    match class {
        "retryable" => Ok(FailureClass::Retryable),
        "terminal" => Ok(FailureClass::Terminal),
        "unknown" => Ok(FailureClass::Unknown),
        other => Err(EngineError::Config(format!(
            "failure class {other:?}: use \"retryable\", \"terminal\" or \"unknown\""
        ))),
    }
}

fn policy_of(policy: &str) -> Result<StepPolicy, EngineError> {
    match policy {
        "retry" => Ok(StepPolicy::Retry),
        "skip" => Ok(StepPolicy::Skip),
        "park" => Ok(StepPolicy::Park),
        other => Err(EngineError::Config(format!(
            "step policy {other:?}: use \"retry\", \"skip\" or \"park\""
        ))),
    }
}

/// The result as the engine takes it: the JSON, or why it is none.
fn result_of(result: Option<String>, unencodable: Option<String>) -> Result<Vec<u8>, String> {
    match (result, unencodable) {
        (Some(json), None) => Ok(json.into_bytes()),
        (_, Some(reason)) => Err(reason),
        (None, None) => Err("no result was given".to_owned()),
    }
}

#[napi]
impl Run {
    /// The run's fencing number (`null` when running unguarded).
    #[napi(getter)]
    pub fn fence(&self) -> Option<f64> {
        // Fences stay below 2^53 (microseconds since 1970 until the year
        // 2255): exact as a JavaScript number.
        self.ctx.fence().map(|f| f as f64)
    }

    /// Which attempt of the key this is (1 for the first).
    #[napi(getter)]
    pub fn attempt(&self) -> u32 {
        self.ctx.attempt()
    }

    /// Whether this run took the key over from a stalled or dead worker.
    #[napi(getter)]
    pub fn takeover(&self) -> bool {
        self.ctx.is_takeover()
    }

    /// Whether the lease is known lost.
    #[napi(getter)]
    pub fn lease_lost(&self) -> bool {
        self.ctx.is_lease_lost()
    }

    /// Throws `LeaseLost` once the lease is known lost.
    #[napi]
    pub fn check(&self) -> napi::Result<()> {
        self.ctx.check().map_err(to_js)
    }

    /// Ends the run with `result` (JSON), or records `unencodable` (why
    /// the value is not JSON) as a terminal failure.
    #[napi]
    pub async fn complete(
        &self,
        result: Option<String>,
        unencodable: Option<String>,
    ) -> napi::Result<()> {
        let (run, local) = self.take().map_err(to_js)?;
        let result = result_of(result, unencodable);
        local
            .spawn(run.complete(result))
            .await
            .and_then(|done| done)
            .map_err(to_js)
    }

    /// Ends the run with the handler's failure (`class`: "retryable",
    /// "terminal" or "unknown").
    #[napi]
    pub async fn fail(&self, message: String, class: String) -> napi::Result<Failed> {
        let failure = HandlerFailure {
            message,
            class: class_of(&class).map_err(to_js)?,
        };
        let (run, local) = self.take().map_err(to_js)?;
        let failed = local
            .spawn(run.fail(failure))
            .await
            .and_then(|failed| failed)
            .map_err(to_js)?;
        Ok(Failed {
            class: failed.class.as_str().to_owned(),
            attempt: failed.attempt,
            retry_after_ms: failed.retry_after.map(|d| d.as_secs_f64() * 1000.0),
        })
    }

    /// Ends the run with nothing recorded: the key is free at once.
    #[napi]
    pub async fn release(&self) -> napi::Result<()> {
        let (run, local) = self.take().map_err(to_js)?;
        local
            .spawn(run.release())
            .await
            .and_then(|done| done)
            .map_err(to_js)
    }

    /// Begins step `name`: a `Step` to run, its journaled result (JSON),
    /// or `null` (skipped in doubt).
    #[napi]
    pub async fn begin_step(
        &self,
        name: String,
        policy: String,
    ) -> napi::Result<Either3<Step, String, Null>> {
        let policy = policy_of(&policy).map_err(to_js)?;
        let local = Arc::clone(self.ctx.local().map_err(to_js)?);
        let ctx = self.ctx.clone();
        let work = ctx.clone();
        let start = local
            .spawn(async move { work.begin_step(&name, policy).await })
            .await
            .and_then(|start| start)
            .map_err(to_js)?;
        Ok(match start {
            StepStart::Done(Some(json)) => Either3::B(String::from_utf8_lossy(&json).into_owned()),
            StepStart::Done(None) => Either3::C(Null),
            StepStart::Open(open) => Either3::A(Step {
                key: open.ctx().key().to_owned(),
                in_doubt: open.ctx().in_doubt(),
                open: Mutex::new(Some(open)),
                ctx,
            }),
        })
    }
}

#[napi]
impl Step {
    /// The step's downstream key: pass it to an external API that
    /// deduplicates.
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.key.clone()
    }

    /// Whether an earlier attempt began the step and never finished it.
    #[napi(getter)]
    pub fn in_doubt(&self) -> bool {
        self.in_doubt
    }

    /// Journals `result` (JSON) as the step's result.
    #[napi]
    pub async fn finish(&self, result: String) -> napi::Result<()> {
        let open = self
            .open
            .lock()
            .take()
            .ok_or_else(|| EngineError::Config("the step has already been finished".to_owned()))
            .map_err(to_js)?;
        let local = Arc::clone(self.ctx.local().map_err(to_js)?);
        let ctx = self.ctx.clone();
        local
            .spawn(async move { ctx.finish_step(open, result.into_bytes()).await })
            .await
            .and_then(|done| done)
            .map_err(to_js)
    }
}
