//! `Run` and `Step`: a held run and one of its journaled steps, ended
//! with JSON bytes.

use std::sync::Arc;

use idem::{FailureClass, OpenStep, StepStart};
use idem_engine::{EngineError, Failed, HandlerFailure, Local, RunContext, StepPolicy};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::aio::awaitable;
use crate::errors::to_py;

/// A claimed run: its lease held by the engine's heartbeat until
/// `complete`, `fail` or `release`.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Run {
    run: Mutex<Option<idem_engine::Run>>,
    ctx: RunContext,
}

/// A journaled step begun and not yet finished.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Step {
    open: Mutex<Option<OpenStep>>,
    /// The step's downstream key: pass it to an external API that
    /// deduplicates.
    #[pyo3(get)]
    key: String,
    /// Whether an earlier attempt began the step and never finished it.
    #[pyo3(get)]
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

    /// The run, to end it, and the engine to end it on.
    fn take(&self, py: Python<'_>) -> PyResult<(idem_engine::Run, Arc<Local>)> {
        let local = Arc::clone(self.ctx.local().map_err(|e| to_py(py, e))?);
        let run = self.run.lock().take().ok_or_else(|| {
            to_py(
                py,
                EngineError::Config("the run has already ended".to_owned()),
            )
        })?;
        Ok((run, local))
    }

    fn local(&self, py: Python<'_>) -> PyResult<Arc<Local>> {
        self.ctx.local().map(Arc::clone).map_err(|e| to_py(py, e))
    }
}

fn class_of(py: Python<'_>, class: &str) -> PyResult<FailureClass> {
    match class {
        "retryable" => Ok(FailureClass::Retryable),
        "terminal" => Ok(FailureClass::Terminal),
        "unknown" => Ok(FailureClass::Unknown),
        other => Err(to_py(
            py,
            EngineError::Config(format!(
                "failure class {other:?}: use 'retryable', 'terminal' or 'unknown'"
            )),
        )),
    }
}

fn policy_of(py: Python<'_>, policy: &str) -> PyResult<StepPolicy> {
    match policy {
        "retry" => Ok(StepPolicy::Retry),
        "skip" => Ok(StepPolicy::Skip),
        "park" => Ok(StepPolicy::Park),
        other => Err(to_py(
            py,
            EngineError::Config(format!(
                "step policy {other:?}: use 'retry', 'skip' or 'park'"
            )),
        )),
    }
}

fn none(py: Python<'_>, (): ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

fn failed_to_py(py: Python<'_>, failed: Failed) -> PyResult<Py<PyAny>> {
    let retry_after = failed.retry_after.map(|d| d.as_secs_f64());
    Ok((failed.class.as_str(), failed.attempt, retry_after)
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

fn step_to_py(py: Python<'_>, start: StepStart) -> PyResult<Py<PyAny>> {
    Ok(match start {
        StepStart::Done(Some(json)) => PyBytes::new(py, &json).into_any().unbind(),
        StepStart::Done(None) => py.None(),
        StepStart::Open(open) => {
            let step = Step {
                key: open.ctx().key().to_owned(),
                in_doubt: open.ctx().in_doubt(),
                open: Mutex::new(Some(open)),
            };
            Py::new(py, step)?.into_any()
        }
    })
}

/// The result as the engine takes it: the JSON, or why it is none.
fn result_of(result: Option<Vec<u8>>, unencodable: Option<String>) -> Result<Vec<u8>, String> {
    match (result, unencodable) {
        (Some(json), None) => Ok(json),
        (_, Some(reason)) => Err(reason),
        (None, None) => Err("no result was given".to_owned()),
    }
}

#[pymethods]
impl Run {
    /// The run's fencing number (`None` when running unguarded).
    #[getter]
    fn fence(&self) -> Option<u64> {
        self.ctx.fence()
    }

    /// Which attempt of the key this is (1 for the first).
    #[getter]
    fn attempt(&self) -> u32 {
        self.ctx.attempt()
    }

    /// Whether this run took the key over from a stalled or dead worker.
    #[getter]
    fn takeover(&self) -> bool {
        self.ctx.is_takeover()
    }

    /// Whether the lease is known lost.
    #[getter]
    fn lease_lost(&self) -> bool {
        self.ctx.is_lease_lost()
    }

    /// Raises `LeaseLost` once the lease is known lost.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.ctx.check().map_err(|e| to_py(py, e))
    }

    /// Ends the run with `result` (JSON bytes), or records `unencodable`
    /// (why the value is not JSON) as a terminal failure.
    #[pyo3(signature = (result, unencodable=None))]
    fn complete(
        &self,
        py: Python<'_>,
        result: Option<Vec<u8>>,
        unencodable: Option<String>,
    ) -> PyResult<()> {
        let (run, local) = self.take(py)?;
        let result = result_of(result, unencodable);
        py.detach(|| local.block_on(run.complete(result)))
            .map_err(|e| to_py(py, e))
    }

    /// `complete`, awaitable.
    #[pyo3(signature = (result, unencodable=None))]
    fn complete_async<'py>(
        &self,
        py: Python<'py>,
        result: Option<Vec<u8>>,
        unencodable: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (run, local) = self.take(py)?;
        let result = result_of(result, unencodable);
        awaitable(py, &local, run.complete(result), none)
    }

    /// Ends the run with the handler's failure (`class`: 'retryable',
    /// 'terminal' or 'unknown'); returns (class recorded, attempt, retry
    /// after in seconds or None).
    fn fail(&self, py: Python<'_>, message: String, class: &str) -> PyResult<Py<PyAny>> {
        let failure = HandlerFailure {
            message,
            class: class_of(py, class)?,
        };
        let (run, local) = self.take(py)?;
        let failed = py.detach(|| local.block_on(run.fail(failure)));
        failed_to_py(py, failed.map_err(|e| to_py(py, e))?)
    }

    /// `fail`, awaitable.
    fn fail_async<'py>(
        &self,
        py: Python<'py>,
        message: String,
        class: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let failure = HandlerFailure {
            message,
            class: class_of(py, class)?,
        };
        let (run, local) = self.take(py)?;
        awaitable(py, &local, run.fail(failure), failed_to_py)
    }

    /// Ends the run with nothing recorded: the key is free at once.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let (run, local) = self.take(py)?;
        py.detach(|| local.block_on(run.release()))
            .map_err(|e| to_py(py, e))
    }

    /// `release`, awaitable.
    fn release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (run, local) = self.take(py)?;
        awaitable(py, &local, run.release(), none)
    }

    /// Begins step `name`: a `Step` to run, its journaled result (JSON
    /// bytes), or `None` (skipped in doubt).
    fn begin_step(&self, py: Python<'_>, name: &str, policy: &str) -> PyResult<Py<PyAny>> {
        let policy = policy_of(py, policy)?;
        let local = self.local(py)?;
        let start = py.detach(|| local.block_on(self.ctx.begin_step(name, policy)));
        step_to_py(py, start.map_err(|e| to_py(py, e))?)
    }

    /// `begin_step`, awaitable.
    fn begin_step_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
        policy: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let policy = policy_of(py, policy)?;
        let local = self.local(py)?;
        let ctx = self.ctx.clone();
        awaitable(
            py,
            &local,
            async move { ctx.begin_step(&name, policy).await },
            step_to_py,
        )
    }

    /// Journals `result` (JSON bytes) as `step`'s result.
    fn finish_step(&self, py: Python<'_>, step: &Step, result: Vec<u8>) -> PyResult<()> {
        let open = step.take(py)?;
        let local = self.local(py)?;
        py.detach(|| local.block_on(self.ctx.finish_step(open, result)))
            .map_err(|e| to_py(py, e))
    }

    /// `finish_step`, awaitable.
    fn finish_step_async<'py>(
        &self,
        py: Python<'py>,
        step: &Step,
        result: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let open = step.take(py)?;
        let local = self.local(py)?;
        let ctx = self.ctx.clone();
        awaitable(
            py,
            &local,
            async move { ctx.finish_step(open, result).await },
            none,
        )
    }
}

impl Step {
    fn take(&self, py: Python<'_>) -> PyResult<OpenStep> {
        self.open.lock().take().ok_or_else(|| {
            to_py(
                py,
                EngineError::Config("the step has already been finished".to_owned()),
            )
        })
    }
}
