//! `Context` and `Step`: what a handler is told about its run (the
//! fence, the lease-lost check) and its journaled steps, ended with JSON
//! bytes. A held `Run` and an HTTP `Turn` hand out the same `Context`.

use std::sync::Arc;

use idem_engine::{Local, RunContext, StepBegun, StepPolicy};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::aio::{awaitable, none};
use crate::errors::to_py;

/// A run as its handler sees it.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Context {
    ctx: RunContext,
}

/// A journaled step begun and not yet finished.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Step {
    step: Arc<idem_engine::Step>,
}

impl Context {
    pub(crate) fn new(ctx: RunContext) -> Self {
        Self { ctx }
    }

    fn local(&self, py: Python<'_>) -> PyResult<Arc<Local>> {
        self.ctx.local().map(Arc::clone).map_err(|e| to_py(py, e))
    }
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
impl Context {
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

    /// Holds a message for the run's completion (the engine's outbox):
    /// its id (a UUIDv7, the broker's deduplication id).
    #[pyo3(signature = (destination, payload, headers=Vec::new()))]
    fn send(
        &self,
        py: Python<'_>,
        destination: &str,
        payload: Vec<u8>,
        headers: Vec<(String, String)>,
    ) -> PyResult<String> {
        self.ctx
            .send(destination, payload, headers)
            .map_err(|e| to_py(py, e))
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
