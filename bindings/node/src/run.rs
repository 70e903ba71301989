//! `Run` and `Step`: a held run and one of its journaled steps, ended
//! with JSON.

use std::sync::Arc;

use idem_engine::{result_of, HandlerFailure, Local, RunContext, StepBegun, StepPolicy};
use napi::bindgen_prelude::{Either3, Null};
use napi_derive::napi;

use crate::errors::to_js;

/// A claimed run: its lease held by the engine's heartbeat until
/// `complete`, `fail` or `release`.
#[napi]
pub struct Run {
    run: Arc<idem_engine::Run>,
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
    step: Arc<idem_engine::Step>,
}

impl Run {
    pub(crate) fn new(run: idem_engine::Run) -> Self {
        let ctx = run.context();
        Self {
            run: Arc::new(run),
            ctx,
        }
    }

    fn local(&self) -> napi::Result<Arc<Local>> {
        self.run.local().map(Arc::clone).map_err(to_js)
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
        let (local, run) = (self.local()?, Arc::clone(&self.run));
        let result = result_of(result.map(String::into_bytes), unencodable);
        local
            .spawn(async move { run.complete(result).await })
            .await
            .and_then(|done| done)
            .map_err(to_js)
    }

    /// Ends the run with the handler's failure (`class`: "retryable",
    /// "terminal" or "unknown").
    #[napi]
    pub async fn fail(&self, message: String, class: String) -> napi::Result<Failed> {
        let failure = HandlerFailure::named(message, &class).map_err(to_js)?;
        let (local, run) = (self.local()?, Arc::clone(&self.run));
        let failed = local
            .spawn(async move { run.fail(failure).await })
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
        let (local, run) = (self.local()?, Arc::clone(&self.run));
        local
            .spawn(async move { run.release().await })
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
        let policy: StepPolicy = policy.parse().map_err(to_js)?;
        let (local, ctx) = (self.local()?, self.ctx.clone());
        let begun = local
            .spawn(async move { ctx.begin_step(&name, policy).await })
            .await
            .and_then(|begun| begun)
            .map_err(to_js)?;
        Ok(match begun {
            StepBegun::Done(Some(json)) => Either3::B(String::from_utf8_lossy(&json).into_owned()),
            StepBegun::Done(None) => Either3::C(Null),
            StepBegun::Open(step) => Either3::A(Step {
                step: Arc::from(step),
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
        self.step.ctx().key().to_owned()
    }

    /// Whether an earlier attempt began the step and never finished it.
    #[napi(getter)]
    pub fn in_doubt(&self) -> bool {
        self.step.ctx().in_doubt()
    }

    /// Journals `result` (JSON) as the step's result.
    #[napi]
    pub async fn finish(&self, result: String) -> napi::Result<()> {
        let local = Arc::clone(self.step.local().map_err(to_js)?);
        let step = Arc::clone(&self.step);
        local
            .spawn(async move { step.finish(result.into_bytes()).await })
            .await
            .and_then(|done| done)
            .map_err(to_js)
    }
}
