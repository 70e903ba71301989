//! idem's executor behind every language.
//!
//! The Python and Node packages, and the `idem` binary, reach idem through
//! this crate, so one executor (heartbeats, fencing, lease-lost checks,
//! store retries for a whole lease, journaled steps) serves them all:
//!
//! - [`store`]: every store by URL: `sqlite:` (the embedded default),
//!   `memory:`, `redis://` and `redis+cluster://`, `postgres://`,
//!   `mysql://`,
//!   `dynamodb://` (feature `dynamodb`) and `http(s)://` for a remote
//!   `idem serve`.
//! - [`Engine`]: an executor over one store, with a Tokio runtime of its
//!   own (its heartbeats never wait for the caller's thread, GIL or event
//!   loop), opened again in a forked child rather than shared with the
//!   parent.
//! - [`Run`]: a held run whose work is done elsewhere, ended with JSON:
//!   the binding converts types and holds no logic of its own.
//! - [`http`]: the `Idempotency-Key` middleware of every language, whose
//!   decisions are the tower layer's.
//! - [`consume`]: the broker consumer of every language, whose decisions
//!   are the consumer layer's.
//! - [`SenderUrl`]: the broker a run's messages go to
//!   ([`RunContext::send`], the executor's outbox), by URL.
//!
//! ```
//! use idem_engine::{Begin, Engine, EngineOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let url = format!("sqlite:{}", dir.path().join("idem.db").display());
//! let engine = Engine::open(&url, EngineOptions::default())?;
//! let here = engine.here()?;
//! let Begin::Run(run) = here.block_on(here.begin("charges", "order-7", None, None))? else {
//!     panic!("the first claim runs")
//! };
//! let fence = run.context().checked_fence()?;
//! here.block_on(run.complete(Ok(format!(r#"{{"fence":{fence}}}"#).into_bytes())))?;
//!
//! let again = here.block_on(here.begin("charges", "order-7", None, None))?;
//! assert!(matches!(again, Begin::Replayed(json) if json == br#"{"fence":1}"#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod consume;
mod engine;
mod error;
pub mod http;
pub mod input;
mod local;
mod options;
mod run;
mod sender;
pub mod store;

pub use engine::Engine;
pub use error::{EngineError, HandlerFailure};
pub use local::Local;
pub use options::EngineOptions;
pub use run::{result_of, Begin, Failed, Run, RunContext, Step, StepBegun, StepPolicy};
pub use sender::SenderUrl;
