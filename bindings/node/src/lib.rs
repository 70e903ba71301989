//! The native half of the npm package `idem-engine`: idem's executor
//! ([`idem_engine`]) behind JavaScript classes. It converts types and
//! errors and holds no logic of its own; every call that waits returns a
//! Promise whose work runs on the engine's runtime, so the event loop never
//! blocks. The JavaScript half (`idem.js`) gives it the package's API.

mod consume;
mod context;
mod engine;
mod errors;
mod http;
mod promise;
mod run;

pub use engine::fingerprint;
