//! `Run` and `Step`: a held run and one of its journaled steps, ended
//! with JSON bytes.

use std::sync::Arc;

use idem_engine::{result_of, Failed, HandlerFailure, Local, RunContext, StepBegun, StepPolicy};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::aio::awaitable;
use crate::errors::to_py;

/// A claimed run: its lease held by the engine's heartbeat until
/// `complete`, `fail` or `release`.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Run {
    run: Arc<idem_engine::Run>,
    ctx: RunContext,
}

/// A journaled step begun and not yet finished.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Step {
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

    fn local(&self, py: Python<'_>) -> PyResult<Arc<Local>> {
        self.run.local().map(Arc::clone).map_err(|e| to_py(py, e))
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

fn step_to_py(py: Python<'_>, begun: StepBegun) -> PyResult<Py<PyAny>> {
    Ok(match begun {
        StepBegun::Done(Some(json)) => PyBytes::new(py, &json).into_any().unbind(),
        StepBegun::Done(None) => py.None(),
        StepBegun::Open(step) => Py::new(
            py,
            Step {
                step: Arc::from(step),
            },
        )?
        .into_any(),
    })
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
        let local = self.local(py)?;
        let result = result_of(result, unencodable);
        py.detach(|| local.block_on(self.run.complete(result)))
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
        let local = self.local(py)?;
        let (run, result) = (Arc::clone(&self.run), result_of(result, unencodable));
        awaitable(py, &local, async move { run.complete(result).await }, none)
    }

    /// Ends the run with the handler's failure (`class`: 'retryable',
    /// 'terminal' or 'unknown'); returns (class recorded, attempt, retry
    /// after in seconds or None).
    fn fail(&self, py: Python<'_>, message: String, class: &str) -> PyResult<Py<PyAny>> {
        let failure = HandlerFailure::named(message, class).map_err(|e| to_py(py, e))?;
        let local = self.local(py)?;
        let failed = py.detach(|| local.block_on(self.run.fail(failure)));
        failed_to_py(py, failed.map_err(|e| to_py(py, e))?)
    }

    /// `fail`, awaitable.
    fn fail_async<'py>(
        &self,
        py: Python<'py>,
        message: String,
        class: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let failure = HandlerFailure::named(message, class).map_err(|e| to_py(py, e))?;
        let local = self.local(py)?;
        let run = Arc::clone(&self.run);
        awaitable(
            py,
            &local,
            async move { run.fail(failure).await },
            failed_to_py,
        )
    }

    /// Ends the run with nothing recorded: the key is free at once.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let local = self.local(py)?;
        py.detach(|| local.block_on(self.run.release()))
            .map_err(|e| to_py(py, e))
    }

    /// `release`, awaitable.
    fn release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let local = self.local(py)?;
        let run = Arc::clone(&self.run);
        awaitable(py, &local, async move { run.release().await }, none)
    }

    /// Begins step `name`: a `Step` to run, its journaled result (JSON
    /// bytes), or `None` (skipped in doubt).
    fn begin_step(&self, py: Python<'_>, name: &str, policy: &str) -> PyResult<Py<PyAny>> {
        let policy: StepPolicy = policy.parse().map_err(|e| to_py(py, e))?;
        let local = self.local(py)?;
        let begun = py.detach(|| local.block_on(self.ctx.begin_step(name, policy)));
        step_to_py(py, begun.map_err(|e| to_py(py, e))?)
    }

    /// `begin_step`, awaitable.
    fn begin_step_async<'py>(
        &self,
        py: Python<'py>,
        name: String,
        policy: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let policy: StepPolicy = policy.parse().map_err(|e| to_py(py, e))?;
        let local = self.local(py)?;
        let ctx = self.ctx.clone();
        awaitable(
            py,
            &local,
            async move { ctx.begin_step(&name, policy).await },
            step_to_py,
        )
    }
}

#[pymethods]
impl Step {
    /// The step's downstream key: pass it to an external API that
    /// deduplicates.
    #[getter]
    fn key(&self) -> &str {
        self.step.ctx().key()
    }

    /// Whether an earlier attempt began the step and never finished it.
    #[getter]
    fn in_doubt(&self) -> bool {
        self.step.ctx().in_doubt()
    }

    /// Journals `result` (JSON bytes) as the step's result.
    fn finish(&self, py: Python<'_>, result: Vec<u8>) -> PyResult<()> {
        let local = Arc::clone(self.step.local().map_err(|e| to_py(py, e))?);
        py.detach(|| local.block_on(self.step.finish(result)))
            .map_err(|e| to_py(py, e))
    }

    /// `finish`, awaitable.
    fn finish_async<'py>(&self, py: Python<'py>, result: Vec<u8>) -> PyResult<Bound<'py, PyAny>> {
        let local = Arc::clone(self.step.local().map_err(|e| to_py(py, e))?);
        let step = Arc::clone(&self.step);
        awaitable(py, &local, async move { step.finish(result).await }, none)
    }
}
