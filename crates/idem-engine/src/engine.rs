//! [`Engine`]: one executor over one store, with a runtime of its own,
//! opened again in each process that uses it.

use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::{default_classifier, Begun, Fingerprint, GetRecord, Idempotency, RecordId, State};
use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::runtime::Runtime;

use crate::error::EngineError;
use crate::run::{HandlerFailure, Run};
use crate::store::{AnyStore, StoreUrl};

/// How an [`Engine`] runs its keys; `Default` is the executor's defaults
/// (a 30 s lease, a day's retention, no waiting for a duplicate in flight).
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// How long a claim is held without a heartbeat (the heartbeat extends
    /// it every third of it while the run lives).
    pub lease: Option<Duration>,
    /// How long results are kept and replayed.
    pub retention: Option<Duration>,
    /// How long terminal failures are kept and replayed.
    pub failure_retention: Option<Duration>,
    /// How long a claim waits for a duplicate in flight to finish, by
    /// default.
    pub wait: Option<Duration>,
    /// Attempts after which a retryable failure is recorded as terminal.
    pub max_attempts: Option<NonZeroU32>,
    /// The largest result stored, in bytes.
    pub max_result_bytes: Option<usize>,
    /// The token for a remote `idem serve` (`http(s)://` URLs).
    pub token: Option<String>,
}

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

/// The engine as opened in one process: its runtime and its executor.
pub struct Local {
    pub(crate) pid: u32,
    parts: Option<Parts>,
}

struct Parts {
    runtime: Runtime,
    idem: Idempotency<AnyStore>,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// What a claim found: a run to do, or a stored result.
#[derive(Debug)]
pub enum Begin {
    /// The key is this caller's to run.
    Run(Run),
    /// The key ran before: its stored result, the JSON as stored.
    Replayed(Vec<u8>),
}

impl Local {
    fn open(url: &StoreUrl, options: &EngineOptions) -> Result<Self, EngineError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("idem-engine")
            .enable_all()
            .build()
            .map_err(EngineError::Runtime)?;
        let store = runtime.block_on(url.open_with(options.token.as_deref()))?;
        let mut builder = Idempotency::builder(store).classify(|error| {
            match error.downcast_ref::<HandlerFailure>() {
                Some(failure) => failure.class,
                None => default_classifier(error),
            }
        });
        if let Some(lease) = options.lease {
            builder = builder.lease(lease);
        }
        if let Some(retention) = options.retention {
            builder = builder.retention(retention);
        }
        if let Some(retention) = options.failure_retention {
            builder = builder.failure_retention(retention);
        }
        if let Some(wait) = options.wait {
            builder = builder.wait_for_in_flight(wait);
        }
        if let Some(attempts) = options.max_attempts {
            builder = builder.max_attempts(attempts);
        }
        if let Some(bytes) = options.max_result_bytes {
            builder = builder.max_response_bytes(bytes);
        }
        let idem = builder
            .build()
            .map_err(|e| EngineError::Config(e.to_string()))?;
        Ok(Self {
            pid: std::process::id(),
            parts: Some(Parts { runtime, idem }),
        })
    }

    fn parts(&self) -> &Parts {
        self.parts
            .as_ref()
            .expect("a Local's parts are taken only when it is dropped")
    }

    /// The executor.
    pub fn idem(&self) -> &Idempotency<AnyStore> {
        &self.parts().idem
    }

    /// Runs `work` to its end on the engine's runtime, blocking this
    /// thread (release the GIL first). Not from inside a Tokio runtime.
    pub fn block_on<F: Future>(&self, work: F) -> F::Output {
        self.parts().runtime.block_on(work)
    }

    /// Starts `work` on the engine's runtime and resolves with its output,
    /// for a caller that awaits it on an event loop of its own.
    pub fn spawn<F>(&self, work: F) -> impl Future<Output = Result<F::Output, EngineError>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self.parts().runtime.spawn(work);
        async move {
            task.await
                .map_err(|e| EngineError::Unexpected(format!("the engine's task ended: {e}")))
        }
    }

    /// Claims `scope`/`key` (with `fingerprint`, JSON, if given), waiting
    /// up to `wait` for a duplicate in flight (`None`: the engine's
    /// default).
    pub async fn begin(
        self: &Arc<Self>,
        scope: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
        wait: Option<Duration>,
    ) -> Result<Begin, EngineError> {
        let id = RecordId::parse(scope, key)?;
        let fingerprint = fingerprint
            .map(Fingerprint::of_json)
            .transpose()
            .map_err(|e| EngineError::Json {
                what: "the fingerprint",
                reason: e.to_string(),
            })?;
        let begun = self
            .idem()
            .begin::<Box<RawValue>, Infallible>(&id, fingerprint, wait)
            .await?;
        Ok(match begun {
            Begun::Held(held) => Begin::Run(Run::new(Arc::clone(self), held)),
            Begun::Replayed(value) => Begin::Replayed(value.get().as_bytes().to_vec()),
        })
    }

    /// The record of `scope`/`key` as `idem serve`'s `GET /v1/record`
    /// answers it (JSON), or `None` if there is none.
    pub async fn record(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, EngineError> {
        let id = RecordId::parse(scope, key)?;
        let Some(mut record) = self
            .idem()
            .store()
            .get(&id)
            .await
            .map_err(EngineError::Store)?
        else {
            return Ok(None);
        };
        // The executor stores its results in an envelope (maybe
        // compressed); the record shows the JSON inside.
        if let State::Completed { response } = &mut record.state {
            let opened = idem::codec::open(response, self.idem().max_response_bytes()).map_err(
                |reason| EngineError::Json {
                    what: "the stored result",
                    reason,
                },
            )?;
            *response = Bytes::copy_from_slice(&opened);
        }
        let answer =
            idem_remote::wire::RecordAnswer::new(scope, key, &record).map_err(|reason| {
                EngineError::Json {
                    what: "the stored result",
                    reason,
                }
            })?;
        serde_json::to_vec(&answer)
            .map(Some)
            .map_err(|e| EngineError::Json {
                what: "the record",
                reason: e.to_string(),
            })
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let Some(parts) = self.parts.take() else {
            return;
        };
        if self.pid == std::process::id() {
            let Parts { runtime, idem } = parts;
            drop(idem);
            // Without waiting: this may run on one of the runtime's own
            // threads (the last holder was a task).
            runtime.shutdown_background();
        } else {
            // A forked child's copy of its parent's: see `Engine::here`.
            std::mem::forget(parts);
        }
    }
}
