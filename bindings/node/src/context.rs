//! `Context` and `Step`: what a handler is told about its run (the
//! fence, the lease-lost check) and its journaled steps, ended with JSON.
//! A held `Run` and an HTTP `Turn` hand out the same `Context`.

use std::sync::Arc;

use idem_engine::{EngineError, Local, RunContext, StepBegun, StepPolicy};
use napi::bindgen_prelude::{Buffer, Either3, Null, PromiseRaw};
use napi::Env;
use napi_derive::napi;

use crate::errors::to_js;
use crate::promise::{promise, same, text};

/// A run as its handler sees it.
#[napi]
pub struct Context {
    ctx: RunContext,
}

/// A journaled step begun and not yet finished: run the work with `key`,
/// then `finish` it with the result.
#[napi]
pub struct Step {
    step: Arc<idem_engine::Step>,
}

impl Context {
    pub(crate) fn new(ctx: RunContext) -> Self {
        Self { ctx }
    }

    fn local(&self) -> napi::Result<Arc<Local>> {
        self.ctx.local().map(Arc::clone).map_err(to_js)
    }
}

#[napi]
impl Context {
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

    /// Holds a message for the run's completion (the engine's outbox):
    /// its id (a UUIDv7, the broker's deduplication id).
    #[napi]
    pub fn send(
        &self,
        destination: String,
        payload: Buffer,
        headers: Vec<Vec<String>>,
    ) -> napi::Result<String> {
        let headers = headers
            .into_iter()
            .map(|pair| match <[String; 2]>::try_from(pair) {
                Ok([name, value]) => Ok((name, value)),
                Err(_) => Err(EngineError::Config(
                    "a header is a [name, value] pair".to_owned(),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_js)?;
        self.ctx
            .send(&destination, payload.to_vec(), headers)
            .map_err(to_js)
    }

    /// Begins step `name`: a `Step` to run, its journaled result (JSON),
    /// or `null` (skipped in doubt).
    #[napi]
    pub fn begin_step<'env>(
        &self,
        env: &'env Env,
        name: String,
        policy: String,
    ) -> napi::Result<PromiseRaw<'env, Either3<Step, String, Null>>> {
        let policy: StepPolicy = policy.parse().map_err(to_js)?;
        let (local, ctx) = (self.local()?, self.ctx.clone());
        let begin = async move { ctx.begin_step(&name, policy).await };
        promise(env, &local, begin, |begun| {
            Ok(match begun {
                StepBegun::Done(Some(json)) => Either3::B(text(json)),
                StepBegun::Done(None) => Either3::C(Null),
                StepBegun::Open(step) => Either3::A(Step {
                    step: Arc::from(step),
                }),
            })
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
    pub fn finish<'env>(
        &self,
        env: &'env Env,
        result: String,
    ) -> napi::Result<PromiseRaw<'env, ()>> {
        let local = Arc::clone(self.step.local().map_err(to_js)?);
        let step = Arc::clone(&self.step);
        promise(
            env,
            &local,
            async move { step.finish(result.into_bytes()).await },
            same,
        )
    }
}
