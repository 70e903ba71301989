//! `HttpGuard` and `Turn`: the `Idempotency-Key` middleware of
//! [`idem_engine::http`] for the package's ASGI and WSGI adapters, which
//! hand over requests as `(method, target, headers, body)` and get back
//! `(status, headers, body)` or the request's turn to run.

use std::sync::Arc;

use idem_engine::http::{self, Exchange, HttpFingerprint, HttpGuard as Guard, HttpOptions};
use idem_engine::http::{HttpRequest, HttpResponse};
use idem_engine::input::{self, Unit};
use idem_engine::{EngineError, Local};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::aio::awaitable;
use crate::context::Context;
use crate::engine::Engine;
use crate::errors::to_py;

/// Header lines as Python hands them over.
type Headers = Vec<(String, Vec<u8>)>;

/// The middleware over an engine; see `idem_engine.asgi` and
/// `idem_engine.wsgi`.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct HttpGuard {
    engine: Py<Engine>,
    guard: Guard,
}

/// A request's turn to run: its run's `context`, and `finish` for the
/// handler's response.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct Turn {
    local: Arc<Local>,
    turn: Arc<idem_engine::http::Turn>,
}

/// A fingerprint rule as Python gives it: a name, or JSON pointers.
#[derive(FromPyObject)]
pub(crate) enum Fingerprint {
    Named(String),
    Fields(Vec<String>),
}

fn response_to_py(py: Python<'_>, response: HttpResponse) -> PyResult<Py<PyAny>> {
    let headers: Vec<(String, Py<PyAny>)> = response
        .headers
        .into_iter()
        .map(|(name, value)| (name, PyBytes::new(py, &value).into_any().unbind()))
        .collect();
    Ok((response.status, headers, PyBytes::new(py, &response.body))
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

fn exchange_to_py(
    py: Python<'_>,
    (local, exchange): (Arc<Local>, Exchange),
) -> PyResult<Py<PyAny>> {
    match exchange {
        Exchange::Answer(response) => response_to_py(py, response),
        Exchange::Turn(turn) => Ok(Py::new(
            py,
            Turn {
                local,
                turn: Arc::new(turn),
            },
        )?
        .into_any()),
    }
}

fn request(
    method: String,
    target: String,
    headers: Headers,
    body: Vec<u8>,
    route: Option<String>,
    tenant: Option<String>,
) -> HttpRequest {
    HttpRequest {
        method,
        target,
        headers,
        body,
        route,
        tenant,
    }
}

#[pymethods]
impl HttpGuard {
    /// The middleware over `engine`'s store (see the adapters for each
    /// option).
    #[new]
    #[pyo3(signature = (
        engine, *, methods=None, header=None, required=false, fingerprint=None, tenant=false,
        max_request_bytes=None, max_response_bytes=None, max_wait=None, default_wait=None,
        forward_takeovers=false, reject_old_uuid_v7=false, keep=None, blobs=None,
        key_in_body=None, webhook=None, webhook_secret=None, mcp=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: Py<Engine>,
        methods: Option<Vec<String>>,
        header: Option<String>,
        required: bool,
        fingerprint: Option<Fingerprint>,
        tenant: bool,
        max_request_bytes: Option<usize>,
        max_response_bytes: Option<usize>,
        max_wait: Option<f64>,
        default_wait: Option<f64>,
        forward_takeovers: bool,
        reject_old_uuid_v7: bool,
        keep: Option<String>,
        blobs: Option<String>,
        key_in_body: Option<String>,
        webhook: Option<String>,
        webhook_secret: Option<String>,
        mcp: Option<String>,
    ) -> PyResult<Self> {
        let options = (|| {
            Ok::<_, EngineError>(HttpOptions {
                methods,
                header,
                required,
                fingerprint: match fingerprint {
                    None => HttpFingerprint::default(),
                    Some(Fingerprint::Named(name)) => name.parse()?,
                    Some(Fingerprint::Fields(fields)) => HttpFingerprint::JsonFields(fields),
                },
                tenant,
                max_request_bytes,
                max_response_bytes,
                max_wait: input::duration("max_wait", max_wait, Unit::Seconds)?,
                default_wait: input::duration("default_wait", default_wait, Unit::Seconds)?,
                forward_takeovers,
                reject_old_uuid_v7,
                keep,
                blobs,
                key_in_body,
                webhook: http::webhook(webhook.as_deref(), webhook_secret.as_deref())?,
                mcp,
            })
        })()
        .map_err(|e| to_py(py, e))?;
        let local = engine.get().here(py)?;
        let guard = Guard::new(&local, options).map_err(|e| to_py(py, e))?;
        Ok(Self { engine, guard })
    }

    /// Whether requests with `method` are covered.
    fn covers(&self, method: &str) -> bool {
        self.guard.covers(method)
    }

    /// Hands a request over: the answer to send (`(status, headers,
    /// body)`), or a `Turn` to run the handler in. Blocks without the GIL.
    #[pyo3(signature = (method, target, headers, body, route=None, tenant=None))]
    #[allow(clippy::too_many_arguments)]
    fn begin(
        &self,
        py: Python<'_>,
        method: String,
        target: String,
        headers: Headers,
        body: Vec<u8>,
        route: Option<String>,
        tenant: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let local = self.engine.get().here(py)?;
        let work = self.guard.begin(
            &local,
            request(method, target, headers, body, route, tenant),
        );
        let exchange = py.detach(|| local.block_on(work));
        exchange_to_py(py, (local, exchange.map_err(|e| to_py(py, e))?))
    }

    /// `begin`, awaitable on the running asyncio loop.
    #[pyo3(signature = (method, target, headers, body, route=None, tenant=None))]
    #[allow(clippy::too_many_arguments)]
    fn begin_async<'py>(
        &self,
        py: Python<'py>,
        method: String,
        target: String,
        headers: Headers,
        body: Vec<u8>,
        route: Option<String>,
        tenant: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let local = self.engine.get().here(py)?;
        let work = self.guard.begin(
            &local,
            request(method, target, headers, body, route, tenant),
        );
        let held = Arc::clone(&local);
        awaitable(
            py,
            &local,
            async move { Ok((held, work.await?)) },
            exchange_to_py,
        )
    }
}

#[pymethods]
impl Turn {
    /// The run the handler runs under, or `None` when the request has no
    /// key and passes through unguarded.
    #[getter]
    fn context(&self, py: Python<'_>) -> PyResult<Option<Py<Context>>> {
        self.turn
            .context()
            .map(|ctx| Py::new(py, Context::new(ctx.clone())))
            .transpose()
    }

    /// Hands over the handler's response; returns the answer to send.
    fn finish(
        &self,
        py: Python<'_>,
        status: u16,
        headers: Headers,
        body: Vec<u8>,
    ) -> PyResult<Py<PyAny>> {
        let work = self.turn.finish(HttpResponse {
            status,
            headers,
            body,
        });
        let answer = py.detach(|| self.local.block_on(work));
        response_to_py(py, answer.map_err(|e| to_py(py, e))?)
    }

    /// `finish`, awaitable.
    fn finish_async<'py>(
        &self,
        py: Python<'py>,
        status: u16,
        headers: Headers,
        body: Vec<u8>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let work = self.turn.finish(HttpResponse {
            status,
            headers,
            body,
        });
        awaitable(py, &self.local, work, response_to_py)
    }
}
