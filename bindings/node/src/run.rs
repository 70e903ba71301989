//! `Run`: a held run, ended with JSON.

use std::sync::Arc;

use idem_engine::{result_of, HandlerFailure, Local};
use napi::bindgen_prelude::PromiseRaw;
use napi::Env;
use napi_derive::napi;

use crate::context::Context;
use crate::errors::to_js;
use crate::promise::{promise, same};

/// A claimed run: its lease held by the engine's heartbeat until
/// `complete`, `fail` or `release`.
#[napi]
pub struct Run {
    run: Arc<idem_engine::Run>,
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

impl Run {
    pub(crate) fn new(run: idem_engine::Run) -> Self {
        Self { run: Arc::new(run) }
    }

    fn local(&self) -> napi::Result<Arc<Local>> {
        self.run.local().map(Arc::clone).map_err(to_js)
    }
}

#[napi]
impl Run {
    /// What the work is told about its run, and its steps.
    #[napi(getter)]
    pub fn context(&self) -> Context {
        Context::new(self.run.context())
    }

    /// Ends the run with `result` (JSON), or records `unencodable` (why
    /// the value is not JSON) as a terminal failure.
    #[napi]
    pub fn complete<'env>(
        &self,
        env: &'env Env,
        result: Option<String>,
        unencodable: Option<String>,
    ) -> napi::Result<PromiseRaw<'env, ()>> {
        let (local, run) = (self.local()?, Arc::clone(&self.run));
        let result = result_of(result.map(String::into_bytes), unencodable);
        promise(env, &local, async move { run.complete(result).await }, same)
    }

    /// Ends the run with the handler's failure (`class`: "retryable",
    /// "terminal" or "unknown").
    #[napi]
    pub fn fail<'env>(
        &self,
        env: &'env Env,
        message: String,
        failure_class: String,
    ) -> napi::Result<PromiseRaw<'env, Failed>> {
        let failure = HandlerFailure::named(message, &failure_class).map_err(to_js)?;
        let (local, run) = (self.local()?, Arc::clone(&self.run));
        promise(
            env,
            &local,
            async move { run.fail(failure).await },
            |failed| {
                Ok(Failed {
                    class: failed.class.as_str().to_owned(),
                    attempt: failed.attempt,
                    retry_after_ms: failed.retry_after.map(|d| d.as_secs_f64() * 1000.0),
                })
            },
        )
    }

    /// Ends the run with nothing recorded: the key is free at once.
    #[napi]
    pub fn release<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
        let (local, run) = (self.local()?, Arc::clone(&self.run));
        promise(env, &local, async move { run.release().await }, same)
    }
}
