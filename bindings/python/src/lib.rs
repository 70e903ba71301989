//! The native half of the Python package `idem-engine`: idem's executor
//! ([`idem_engine`]) behind Python classes. It converts types and errors
//! and holds no logic of its own; the Python half (`python/idem_engine`)
//! gives it the package's API (the decorator, context managers, outcomes).

mod aio;
mod consume;
mod context;
mod engine;
mod errors;
mod http;
mod run;

use pyo3::prelude::*;

/// The module `idem_engine._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<run::Run>()?;
    m.add_class::<context::Context>()?;
    m.add_class::<context::Step>()?;
    m.add_class::<http::HttpGuard>()?;
    m.add_class::<http::Turn>()?;
    m.add_class::<consume::ConsumerGuard>()?;
    m.add_class::<consume::DeliveryTurn>()?;
    m.add_function(wrap_pyfunction!(aio::settle, m)?)?;
    m.add_function(wrap_pyfunction!(engine::fingerprint, m)?)?;
    Ok(())
}
