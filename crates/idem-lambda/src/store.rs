//! The store a function's records live in, named by its environment.

use idem_engine::store::{AnyStore, OpenError, StoreUrl, StoreUrlError};

/// The environment variable naming the store by URL.
pub const STORE_ENV: &str = "IDEM_STORE";

/// The store when [`STORE_ENV`] is not set: the DynamoDB table `idem` in
/// the function's region, with the function's credentials (made by
/// `idem_dynamodb::create_table`, or on first use with `?create=true`).
pub const DEFAULT_STORE: &str = "dynamodb://idem";

/// Why the store named by the environment could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvStoreError {
    /// The URL is not one idem reads.
    #[error("{STORE_ENV}: {0}")]
    Url(#[from] StoreUrlError),
    /// The store could not be reached or opened.
    #[error("{STORE_ENV}: {0}")]
    Open(#[from] OpenError),
}

/// Opens the store [`STORE_ENV`] names, any URL `idem` reads
/// (`dynamodb://TABLE`, `postgres://…`, `redis://…`, `http(s)://` for an
/// `idem serve`), or [`DEFAULT_STORE`]. Open it once, before the runtime
/// loop, so every invocation of a warm function reuses its connections.
pub async fn store_from_env() -> Result<AnyStore, EnvStoreError> {
    let url = std::env::var(STORE_ENV).unwrap_or_else(|_| DEFAULT_STORE.to_owned());
    let url: StoreUrl = url.parse()?;
    Ok(url.open().await?)
}
