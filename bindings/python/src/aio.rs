//! Awaitables for asyncio: the work runs on the engine's runtime, and its
//! answer is handed to the event loop with `call_soon_threadsafe`, so the
//! loop never blocks on Rust.

use std::future::Future;
use std::sync::Arc;

use idem_engine::{EngineError, Local};
use pyo3::prelude::*;

/// How an answer becomes a Python value (with the GIL held).
pub(crate) type Convert<T> = fn(Python<'_>, T) -> PyResult<Py<PyAny>>;

/// `None`, for work that answers nothing.
pub(crate) fn none(py: Python<'_>, (): ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

/// An `asyncio.Future` of the running loop that `work`'s answer settles.
pub(crate) fn awaitable<'py, T, F>(
    py: Python<'py>,
    local: &Arc<Local>,
    work: F,
    convert: Convert<T>,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, EngineError>> + Send + 'static,
    T: Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let (event_loop, settled) = (event_loop.unbind(), future.clone().unbind());
    // Started now; answered exactly once, a panic included.
    local.settle(work, move |answer| {
        Python::attach(|py| {
            let (ok, value) = match answer
                .map_err(|e| crate::errors::to_py(py, e))
                .and_then(|value| convert(py, value))
            {
                Ok(value) => (true, value),
                Err(error) => (false, error.into_value(py).into_any()),
            };
            let settle = match wrap_pyfunction!(settle, py) {
                Ok(settle) => settle,
                Err(_) => return,
            };
            // A closed loop has no one left to answer.
            let _ =
                event_loop.call_method1(py, "call_soon_threadsafe", (settle, settled, ok, value));
        });
    });
    Ok(future)
}

/// Settles `future` with `value` (a result if `ok`, else an exception),
/// unless it was cancelled meanwhile.
#[pyfunction]
pub(crate) fn settle(
    future: &Bound<'_, PyAny>,
    ok: bool,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    if future.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    let method = if ok { "set_result" } else { "set_exception" };
    future.call_method1(method, (value,))?;
    Ok(())
}
