//! `Idempotency-Key` middleware for tower and axum.
//!
//! [`IdempotencyLayer`] gives covered requests (POST and PATCH by default)
//! the semantics of the IETF draft "The Idempotency-Key HTTP Header Field"
//! as pinned down in idem's design (§8); each refusal is a typed
//! [`Rejection`]:
//!
#![doc = include_str!("../docs/status.md")]
//!
//! Exactly one request per key runs at a time and at most one completes:
//! concurrent duplicates get 409, later ones the stored response. 2xx and
//! 4xx responses are stored (except 408, 409, 425 and 429); anything else
//! releases the key so the client can retry. Every covered response says
//! how long keys are kept in `Idempotency-Key-Lifetime` (seconds).
//!
//! **Run to completion.** Once a covered request's key is claimed, the rest
//! (the inner service, reading and storing its response, the lease's
//! heartbeat) runs to its end: a client that disconnects does not cut the
//! inner service off (the run goes on in a task of its own). Call
//! [`IdempotencyLayer::drain`] after your server's graceful shutdown so
//! such work finishes before the process exits.
//!
//! **The handler's context.** The inner service receives the run's
//! [`idem::Context`] as a request extension: its fence (to fence its own
//! writes), its attempt, whether it took over from an attempt that died, and
//! the lease-lost signal.
//!
//! Scopes are `METHOD route` plus, when configured, a hashed tenant, so no
//! client can replay another client's response. Take the tenant from the
//! verified principal ([`tenant_principal`](IdempotencyLayerBuilder::tenant_principal)),
//! not from a token that changes when it is refreshed. Stored responses keep
//! repeated headers and trailers (gRPC's `grpc-status`) and drop hop-by-hop
//! headers.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{http::StatusCode, routing::post, Extension, Router};
//! use idem_http::IdempotencyLayer;
//!
//! /// Set by your authentication layer once it has verified the caller.
//! #[derive(Clone)]
//! struct Account {
//!     id: u64,
//! }
//!
//! async fn charge(Extension(run): Extension<idem::Context>) -> Result<String, StatusCode> {
//!     // Pass the fence to writes that can refuse an older holder's; Err
//!     // once the lease is lost (another attempt owns the key now).
//!     let fence = run.checked_fence().map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
//!     if run.is_takeover() {
//!         // Only with forward_takeovers(true): an earlier attempt died
//!         // and may have partly run; check before acting again.
//!     }
//!     Ok(format!("charged under fence {fence}"))
//! }
//!
//! let store = idem_sqlite::SqliteStore::open("idem.db")?;
//! let layer = IdempotencyLayer::builder(store)
//!     .required(true)
//!     .tenant_principal(|account: &Account| account.id.to_string())
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/charges", post(charge))
//!     .layer(layer.clone());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app)
//!     .with_graceful_shutdown(async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! layer.drain().await;
//! # Ok(()) }
//! ```

mod body;
mod detach;
mod grpc;
mod header;
mod keep;
mod layer;
mod marker;
mod mcp;
mod problem;
pub mod problem_types;
pub mod reconcile;
mod rejection;
mod request;
mod rules;
mod service;
mod stored;
mod webhook;

pub use body::IdemBody;
pub use header::{parse_key, KeyHeaderError};
pub use keep::{KeepRules, PolicyError, ReplayPolicy, DEFAULT_REFERENCE_THRESHOLD, REDACTED};
pub use layer::{
    IdempotencyLayer, IdempotencyLayerBuilder, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_WAIT,
};
pub use marker::{NotExecuted, OutcomeUnknown};
pub use mcp::{MCP_KEY_ARGUMENT, MCP_REPLAYED_META};
pub use problem::Problem;
pub use rejection::Rejection;
pub use request::{LIFETIME_HEADER, REPLAYED_HEADER, REPLAY_KEPT_HEADER};
pub use rules::{default_stored, FingerprintHook, FingerprintRule};
pub use service::IdempotencyService;
pub use stored::{strip_hop_by_hop, Binary, Kept, StoredResponse};
pub use webhook::{Webhook, WebhookKind, WebhookSecretError, DEFAULT_TOLERANCE};
