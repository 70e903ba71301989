//! `Engine`: an executor over one store, opened from its URL.

use std::sync::Arc;
use std::time::Duration;

use idem_engine::input::{self, Unit};
use idem_engine::{Begin, EngineError, EngineOptions, Local};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::aio::awaitable;
use crate::errors::to_py;
use crate::run::Run;

/// idem's executor over the store at a URL; see the package's `Idem`.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Engine {
    engine: idem_engine::Engine,
}

/// Seconds from Python as a duration.
fn duration(name: &str, seconds: Option<f64>) -> Result<Option<Duration>, EngineError> {
    input::duration(name, seconds, Unit::Seconds)
}

fn begin_to_py(py: Python<'_>, begin: Begin) -> PyResult<Py<PyAny>> {
    Ok(match begin {
        Begin::Run(run) => Py::new(py, Run::new(run))?.into_any(),
        Begin::Replayed(json) => PyBytes::new(py, &json).into_any().unbind(),
    })
}

fn record_to_py(py: Python<'_>, record: Option<Vec<u8>>) -> PyResult<Py<PyAny>> {
    Ok(match record {
        Some(json) => PyBytes::new(py, &json).into_any().unbind(),
        None => py.None(),
    })
}

impl Engine {
    pub(crate) fn here(&self, py: Python<'_>) -> PyResult<Arc<Local>> {
        py.detach(|| self.engine.here()).map_err(|e| to_py(py, e))
    }
}

#[pymethods]
impl Engine {
    /// Opens the store at `url` (connecting to it, for a networked one).
    #[new]
    #[pyo3(signature = (
        url, *, lease=None, retention=None, failure_retention=None, wait=None,
        max_attempts=None, max_result_bytes=None, token=None, keyring=None, key_secret=None,
        outbox=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &str,
        lease: Option<f64>,
        retention: Option<f64>,
        failure_retention: Option<f64>,
        wait: Option<f64>,
        max_attempts: Option<u32>,
        max_result_bytes: Option<usize>,
        token: Option<String>,
        keyring: Option<std::path::PathBuf>,
        key_secret: Option<std::path::PathBuf>,
        outbox: Option<String>,
    ) -> PyResult<Self> {
        let options = (|| {
            Ok::<_, EngineError>(EngineOptions {
                lease: duration("lease", lease)?,
                retention: duration("retention", retention)?,
                failure_retention: duration("failure_retention", failure_retention)?,
                wait: duration("wait", wait)?,
                max_attempts: input::attempts("max_attempts", max_attempts)?,
                max_result_bytes,
                token,
                keyring,
                key_secret,
                outbox,
            })
        })()
        .map_err(|e| to_py(py, e))?;
        let engine = py
            .detach(|| idem_engine::Engine::open(url, options))
            .map_err(|e| to_py(py, e))?;
        Ok(Self { engine })
    }

    /// The store's URL, its password hidden.
    #[getter]
    fn url(&self) -> String {
        self.engine.url()
    }

    /// Claims `scope`/`key`: a `Run` to do, or the stored result (JSON
    /// bytes). Blocks without the GIL.
    #[pyo3(signature = (scope, key, fingerprint=None, wait=None))]
    fn begin(
        &self,
        py: Python<'_>,
        scope: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
        wait: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let local = self.here(py)?;
        let wait = duration("wait", wait).map_err(|e| to_py(py, e))?;
        let begun = py.detach(|| local.block_on(local.begin(scope, key, fingerprint, wait)));
        begin_to_py(py, begun.map_err(|e| to_py(py, e))?)
    }

    /// `begin`, awaitable on the running asyncio loop.
    #[pyo3(signature = (scope, key, fingerprint=None, wait=None))]
    fn begin_async<'py>(
        &self,
        py: Python<'py>,
        scope: String,
        key: String,
        fingerprint: Option<Vec<u8>>,
        wait: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let local = self.here(py)?;
        let wait = duration("wait", wait).map_err(|e| to_py(py, e))?;
        let work = Arc::clone(&local);
        awaitable(
            py,
            &local,
            async move { work.begin(&scope, &key, fingerprint.as_deref(), wait).await },
            begin_to_py,
        )
    }

    /// The record of `scope`/`key` as JSON bytes (as `idem serve`'s
    /// `GET /v1/record` answers), or `None`.
    fn record(&self, py: Python<'_>, scope: &str, key: &str) -> PyResult<Py<PyAny>> {
        let local = self.here(py)?;
        let record = py.detach(|| local.block_on(local.record(scope, key)));
        record_to_py(py, record.map_err(|e| to_py(py, e))?)
    }
}

/// The fingerprint (hex SHA-256 of the canonical JSON) of `json`, as the
/// executor computes it for a claim.
#[pyfunction]
pub(crate) fn fingerprint(py: Python<'_>, json: &[u8]) -> PyResult<String> {
    idem::Fingerprint::of_json(json)
        .map(|f| f.to_hex())
        .map_err(|e| {
            to_py(
                py,
                EngineError::Json {
                    what: "the fingerprint",
                    reason: e.to_string(),
                },
            )
        })
}
