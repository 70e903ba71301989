//! Engine errors as the package's exceptions (defined in
//! `idem_engine/_errors.py`, so they read as Python's own).

use idem::step::StepError;
use idem_engine::EngineError;
use pyo3::prelude::*;

/// Raises the exception `name` of `idem_engine._errors`, built from `args`.
fn raise<'py, A>(py: Python<'py>, name: &str, args: A) -> PyErr
where
    A: pyo3::call::PyCallArgs<'py>,
{
    let built = py
        .import("idem_engine._errors")
        .and_then(|module| module.getattr(name))
        .and_then(|class| class.call1(args));
    match built {
        Ok(exception) => PyErr::from_value(exception),
        Err(error) => error,
    }
}

/// The exception for `error`: its class ([`EngineError::kind`]) says what
/// happened, its text what to do (the whole chain of causes, once), and
/// its fields what a caller branches on.
pub(crate) fn to_py(py: Python<'_>, error: EngineError) -> PyErr {
    let (kind, text) = (error.kind(), idem::error_chain(&error));
    match error {
        EngineError::InProgress { retry_after } => {
            raise(py, kind, (text, retry_after.as_secs_f64()))
        }
        EngineError::KeyExpired { age } => raise(py, kind, (text, age.as_secs_f64())),
        EngineError::ReplayedFailure { class, message } => {
            raise(py, kind, (text, class.as_str(), message))
        }
        EngineError::Step(StepError::Parked { step, attempt }) => {
            raise(py, kind, (text, step, attempt))
        }
        _ => raise(py, kind, (text,)),
    }
}
