//! `Run`: a held run, ended with JSON bytes.

use std::sync::Arc;

use idem_engine::{result_of, Failed, HandlerFailure, Local};
use pyo3::prelude::*;

use crate::aio::{awaitable, none};
use crate::context::Context;
use crate::errors::to_py;

/// A claimed run: its lease held by the engine's heartbeat until
/// `complete`, `fail` or `release`.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Run {
    run: Arc<idem_engine::Run>,
}

impl Run {
    pub(crate) fn new(run: idem_engine::Run) -> Self {
        Self { run: Arc::new(run) }
    }

    fn local(&self, py: Python<'_>) -> PyResult<Arc<Local>> {
        self.run.local().map(Arc::clone).map_err(|e| to_py(py, e))
    }
}

fn failed_to_py(py: Python<'_>, failed: Failed) -> PyResult<Py<PyAny>> {
    let retry_after = failed.retry_after.map(|d| d.as_secs_f64());
    Ok((failed.class.as_str(), failed.attempt, retry_after)
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

#[pymethods]
impl Run {
    /// What the work is told about its run, and its steps.
    #[getter]
    fn context(&self, py: Python<'_>) -> PyResult<Py<Context>> {
        Py::new(py, Context::new(self.run.context()))
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
}
