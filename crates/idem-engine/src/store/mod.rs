//! Every store by URL: [`StoreUrl`] reads one, [`AnyStore`] is the store
//! it opens.

mod any;
mod blobs;
mod url;

pub use any::AnyStore;
pub use blobs::{BlobUrl, BlobUrlError};
pub use url::{OpenError, StoreUrl, StoreUrlError, DEFAULT_STORE};
