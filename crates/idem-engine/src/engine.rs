//! [`Engine`]: one executor over one store, opened again in each process
//! that uses it.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::EngineError;
use crate::local::Local;
use crate::options::EngineOptions;
use crate::store::StoreUrl;

/// idem's executor over one store, for callers in another language.
///
/// Its work runs on a Tokio runtime of its own (two threads), so a
/// heartbeat never waits for the caller's thread. Each process gets its
/// own [`Local`] from [`here`](Self::here): a forked child opens the
/// store again rather than use its parent's runtime, connections or runs,
/// whose threads it does not have.
pub struct Engine {
    url: StoreUrl,
    options: EngineOptions,
    local: Mutex<Arc<Local>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("url", &self.url.to_string())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Opens the store at `url` (see [`StoreUrl`]; connecting to it, for a
    /// networked one).
    pub fn open(url: &str, options: EngineOptions) -> Result<Self, EngineError> {
        let url: StoreUrl = url.parse()?;
        let local = Local::open(&url, &options)?;
        Ok(Self {
            url,
            options,
            local: Mutex::new(Arc::new(local)),
        })
    }

    /// The store's URL, its password hidden.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// The engine of this process: the one opened here, or, in a forked
    /// child, a new one over the same URL (opened on first use there).
    pub fn here(&self) -> Result<Arc<Local>, EngineError> {
        let current = Arc::clone(&self.local.lock());
        if current.pid == std::process::id() {
            return Ok(current);
        }
        // A fork: the parent's runtime has no threads here, and its
        // connections are the parent's. Leave them untouched (dropping
        // them would deregister the parent's sockets from the epoll
        // instance both processes share) and open anew.
        std::mem::forget(current);
        let fresh = Arc::new(Local::open(&self.url, &self.options)?);
        let old = std::mem::replace(&mut *self.local.lock(), Arc::clone(&fresh));
        std::mem::forget(old);
        Ok(fresh)
    }
}
