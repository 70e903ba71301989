//! Engine errors as the package's exceptions (defined in
//! `idem_engine/_errors.py`, so they read as Python's own).

use std::time::Duration;

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

fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// The exception for `error`: its class says what happened, its text
/// what to do (the whole chain of causes, once).
pub(crate) fn to_py(py: Python<'_>, error: EngineError) -> PyErr {
    let text = idem::error_chain(&error);
    match error {
        EngineError::Url(_)
        | EngineError::Config(_)
        | EngineError::Key(_)
        | EngineError::Json { .. } => raise(py, "InvalidInput", (text,)),
        EngineError::Open(_) | EngineError::Store(_) => raise(py, "Unavailable", (text,)),
        EngineError::InProgress { retry_after } => {
            raise(py, "InProgress", (text, seconds(retry_after)))
        }
        EngineError::Mismatch => raise(py, "Mismatch", (text,)),
        EngineError::ReplayedFailure { class, message } => {
            raise(py, "ReplayedFailure", (text, class.as_str(), message))
        }
        EngineError::LeaseLost => raise(py, "LeaseLost", (text,)),
        EngineError::TooLarge { .. } => raise(py, "ResultTooLarge", (text,)),
        EngineError::Step(step) => match step {
            StepError::Parked { step, attempt } => raise(py, "StepInDoubt", (text, step, attempt)),
            StepError::LeaseLost { .. } => raise(py, "LeaseLost", (text,)),
            StepError::Store { .. } => raise(py, "Unavailable", (text,)),
            _ => raise(py, "InvalidStep", (text,)),
        },
        _ => raise(py, "IdemError", (text,)),
    }
}
