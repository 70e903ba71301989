//! `ConsumerGuard` and `DeliveryTurn`: the broker consumer of
//! [`idem_engine::consume`] for the package's aio-pika adapter, which
//! hands over messages as `(payload, headers, message_id, delivery_count)`
//! and gets back a settlement or the message's turn to run.

use std::sync::Arc;

use idem_engine::consume::{ConsumeOptions, ConsumerGuard as Guard, Delivered, Delivery};
use idem_engine::consume::{DeliveryTurn as Turn, Settlement};
use idem_engine::input::{self, Unit};
use idem_engine::{result_of, EngineError, HandlerFailure, Local};
use pyo3::prelude::*;

use crate::aio::awaitable;
use crate::context::Context;
use crate::engine::Engine;
use crate::errors::to_py;

/// The consumer over an engine; see `idem_engine.rabbitmq`.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct ConsumerGuard {
    engine: Py<Engine>,
    guard: Guard,
}

/// A message's turn to run: its run's `context`, and `complete` or `fail`
/// with the handler's outcome.
#[pyclass(module = "idem_engine._native", frozen)]
pub(crate) struct DeliveryTurn {
    local: Arc<Local>,
    turn: Arc<Turn>,
}

/// `(action, after seconds, reason, replayed, key, dead-letter headers)`.
fn settlement_to_py(py: Python<'_>, settled: Settlement) -> PyResult<Py<PyAny>> {
    Ok((
        settled.action.as_str(),
        settled.after.map(|d| d.as_secs_f64()),
        settled.reason,
        settled.replayed,
        settled.key,
        settled.dead_letter_headers,
    )
        .into_pyobject(py)?
        .into_any()
        .unbind())
}

fn delivered_to_py(
    py: Python<'_>,
    (local, delivered): (Arc<Local>, Delivered),
) -> PyResult<Py<PyAny>> {
    match delivered {
        Delivered::Settled(settled) => settlement_to_py(py, settled),
        Delivered::Turn(turn) => Ok(Py::new(
            py,
            DeliveryTurn {
                local,
                turn: Arc::new(turn),
            },
        )?
        .into_any()),
    }
}

#[pymethods]
impl ConsumerGuard {
    /// The consumer of `scope` over `engine`'s store (see the adapter for
    /// each option).
    #[new]
    #[pyo3(signature = (
        engine, scope, *, keys=None, fingerprint=None, name=None, min_retry_delay=None,
        max_retry_delay=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: Py<Engine>,
        scope: String,
        keys: Option<Vec<String>>,
        fingerprint: Option<bool>,
        name: Option<String>,
        min_retry_delay: Option<f64>,
        max_retry_delay: Option<f64>,
    ) -> PyResult<Self> {
        let options = (|| {
            Ok::<_, EngineError>(ConsumeOptions {
                scope,
                keys,
                fingerprint,
                name,
                min_retry_delay: input::duration(
                    "min_retry_delay",
                    min_retry_delay,
                    Unit::Seconds,
                )?,
                max_retry_delay: input::duration(
                    "max_retry_delay",
                    max_retry_delay,
                    Unit::Seconds,
                )?,
            })
        })()
        .map_err(|e| to_py(py, e))?;
        let local = engine.get().here(py)?;
        let guard = Guard::new(&local, options).map_err(|e| to_py(py, e))?;
        Ok(Self { engine, guard })
    }

    /// `begin`, awaitable on the running asyncio loop: the settlement, or
    /// a `DeliveryTurn` to run the handler in.
    #[pyo3(signature = (payload, headers, message_id=None, delivery_count=None))]
    fn begin_async<'py>(
        &self,
        py: Python<'py>,
        payload: Vec<u8>,
        headers: Vec<(String, String)>,
        message_id: Option<String>,
        delivery_count: Option<u32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let local = self.engine.get().here(py)?;
        let work = self.guard.begin(
            &local,
            Delivery {
                payload,
                headers,
                message_id,
                delivery_count,
            },
        );
        let held = Arc::clone(&local);
        awaitable(
            py,
            &local,
            async move { Ok((held, work.await?)) },
            delivered_to_py,
        )
    }
}

#[pymethods]
impl DeliveryTurn {
    /// The run the handler runs under.
    #[getter]
    fn context(&self, py: Python<'_>) -> PyResult<Py<Context>> {
        Py::new(py, Context::new(self.turn.context().clone()))
    }

    /// The message's key.
    #[getter]
    fn key(&self) -> &str {
        self.turn.key()
    }

    /// Stores `result` (JSON bytes), or records `unencodable` (why the
    /// value is not JSON) as a terminal failure; awaitable, resolves with
    /// the settlement.
    #[pyo3(signature = (result, unencodable=None))]
    fn complete_async<'py>(
        &self,
        py: Python<'py>,
        result: Option<Vec<u8>>,
        unencodable: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let work = self.turn.complete(result_of(result, unencodable));
        awaitable(py, &self.local, work, settlement_to_py)
    }

    /// Records the handler's failure (`class`: 'retryable', 'terminal' or
    /// 'unknown'); awaitable, resolves with the settlement.
    fn fail_async<'py>(
        &self,
        py: Python<'py>,
        message: String,
        class: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let failure = HandlerFailure::named(message, class).map_err(|e| to_py(py, e))?;
        let work = self.turn.fail(failure);
        awaitable(py, &self.local, work, settlement_to_py)
    }
}
