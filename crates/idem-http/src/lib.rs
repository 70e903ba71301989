//! `Idempotency-Key` middleware for tower and axum.
//!
//! [`IdempotencyLayer`] gives covered requests (POST and PATCH by default)
//! the semantics of the IETF draft "The Idempotency-Key HTTP Header Field"
//! as pinned down in idem's design (§8):
//!
//! | situation | response |
//! |---|---|
//! | method not covered | passed through untouched |
//! | key missing, key required | 400 problem+json |
//! | key malformed | 400 problem+json naming the rule |
//! | same key, request still running | 409 problem+json + `Retry-After` |
//! | same key, different request (fingerprint) | 422 problem+json |
//! | same key, completed | stored status, headers and body + `Idempotent-Replayed: true` |
//! | store unreachable (fail-closed) | 503 problem+json + `Retry-After` |
//! | request body over the limit | 413 problem+json, key not used |
//! | inner service / upstream failed | 502 problem+json, key released |
//! | request may have reached the upstream, response lost ([`OutcomeUnknown`], a body that broke off) | 502 problem+json, key kept as unknown; later requests 422 |
//!
//! Exactly one request per key runs at a time and at most one completes:
//! concurrent duplicates get 409, later ones the stored response. 2xx and
//! 4xx responses are stored (except 408, 409, 425 and 429); anything else
//! releases the key so the client can retry. Every covered response says
//! how long keys are kept in `Idempotency-Key-Lifetime` (seconds).
//!
//! Scopes are `METHOD route` plus, when configured, a hashed tenant, so no
//! client can replay another client's response. Stored responses keep
//! repeated headers and drop hop-by-hop ones; trailers are not stored.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{routing::post, Router};
//! use idem_http::IdempotencyLayer;
//!
//! let store = idem_sqlite::SqliteStore::open("idem.db")?;
//! let layer = IdempotencyLayer::builder(store)
//!     .required(true)
//!     .tenant_header(http::header::AUTHORIZATION)
//!     .build()?;
//! let app: Router = Router::new()
//!     .route("/charges", post(|| async { "charged" }))
//!     .layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

mod body;
mod header;
mod layer;
mod marker;
mod problem;
mod rejection;
mod request;
mod service;
mod stored;

pub use body::IdemBody;
pub use header::{parse_key, KeyHeaderError};
pub use layer::{
    default_stored, FingerprintHook, FingerprintRule, IdempotencyLayer, IdempotencyLayerBuilder,
};
pub use marker::{NotExecuted, OutcomeUnknown};
pub use problem::types as problem_types;
pub use rejection::Rejection;
pub use request::{LIFETIME_HEADER, REPLAYED_HEADER};
pub use service::IdempotencyService;
pub use stored::{strip_hop_by_hop, Binary, StoredResponse};
