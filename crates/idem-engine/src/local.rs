//! [`Local`]: the engine as opened in one process, its runtime and its
//! executor.

use std::future::Future;
use std::marker::PhantomData;

use bytes::Bytes;
use idem::outbox::DEFAULT_DISPATCH_INTERVAL;
use idem::{default_classifier, GetRecord, Idempotency, PurgerHandle, RecordId, State, Store as _};
use tokio::runtime::Runtime;

use crate::error::{EngineError, HandlerFailure};
use crate::options::EngineOptions;
use crate::sender::SenderUrl;
use crate::store::{AnyStore, StoreUrl};

/// The engine as opened in one process: its runtime and its executor.
pub struct Local {
    pub(crate) pid: u32,
    parts: Option<Parts>,
}

struct Parts {
    runtime: Runtime,
    idem: Idempotency<AnyStore>,
    /// The outbox dispatcher, when there is an outbox: stops when dropped.
    dispatcher: Option<PurgerHandle>,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Local {
    pub(crate) fn open(url: &StoreUrl, options: &EngineOptions) -> Result<Self, EngineError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("idem-engine")
            .enable_all()
            .build()
            .map_err(EngineError::Runtime)?;
        let store = runtime.block_on(url.open_with(options.token.as_deref()))?;
        let served = store.sends_messages();
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
        if let Some(path) = &options.keyring {
            let keyring = idem::codec::Keyring::from_file(path)
                .map_err(|e| EngineError::Config(format!("keyring: {e}")))?;
            builder = builder.keyring(keyring);
        }
        if let Some(path) = &options.key_secret {
            let hasher = idem::key_hash::KeyHasher::from_file(path)
                .map_err(|e| EngineError::Config(e.to_string()))?;
            builder = builder.hash_keys(hasher);
        }
        let outbox = match &options.outbox {
            Some(url) if served => {
                return Err(EngineError::Config(format!(
                    "outbox {url:?}: over idem serve the server sends the messages runs send; \
                     start it with --outbox {url} and leave the outbox unset here"
                )));
            }
            None if served => {
                builder = builder.outbox_sent_by_store();
                false
            }
            Some(url) => {
                let url: SenderUrl = url.parse()?;
                builder = builder.outbox(runtime.block_on(url.open())?);
                true
            }
            None => false,
        };
        let idem = builder
            .build()
            .map_err(|e| EngineError::Config(e.to_string()))?;
        let dispatcher = outbox.then(|| {
            let _entered = runtime.enter();
            idem.spawn_outbox_dispatcher(DEFAULT_DISPATCH_INTERVAL)
        });
        Ok(Self {
            pid: std::process::id(),
            parts: Some(Parts {
                runtime,
                idem,
                dispatcher,
            }),
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

    /// Starts `work` on the engine's runtime and hands its answer to
    /// `answer` there: for a binding that settles a promise of its own
    /// event loop, with no runtime of its own in between. `answer` is
    /// called exactly once, also when `work` panics or the runtime drops
    /// it (with [`EngineError::Unexpected`]), so no promise is left
    /// pending for ever.
    pub fn settle<T, F, A>(&self, work: F, answer: A)
    where
        F: Future<Output = Result<T, EngineError>> + Send + 'static,
        T: Send + 'static,
        A: FnOnce(Result<T, EngineError>) + Send + 'static,
    {
        let mut pending = Pending(Some(answer), PhantomData);
        drop(self.parts().runtime.spawn(async move {
            let output = work.await;
            if let Some(answer) = pending.0.take() {
                answer(output);
            }
        }));
    }

    /// The record of `scope`/`key` as `idem serve`'s `GET /v1/record`
    /// answers it (JSON), or `None` if there is none.
    pub async fn record(&self, scope: &str, key: &str) -> Result<Option<Vec<u8>>, EngineError> {
        let id = RecordId::parse(scope, key)?;
        let id = self.idem().stored_id(&id).into_owned();
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
            let idem = self.idem();
            let opened = idem
                .at_rest()
                .open_response(&id, response, idem.max_response_bytes())
                .map_err(|reason| EngineError::Json {
                    what: "the stored result",
                    reason,
                })?;
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
            let Parts {
                runtime,
                idem,
                dispatcher,
            } = parts;
            drop(dispatcher);
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

/// An answer not given yet: given [`EngineError::Unexpected`] if its task
/// ends without one (a panic unwinding it, or the runtime dropping it).
struct Pending<T, A: FnOnce(Result<T, EngineError>)>(Option<A>, PhantomData<fn(T)>);

impl<T, A: FnOnce(Result<T, EngineError>)> Drop for Pending<T, A> {
    fn drop(&mut self) {
        if let Some(answer) = self.0.take() {
            answer(Err(EngineError::Unexpected(
                "the engine's task ended without an answer (it panicked or the engine closed)"
                    .to_owned(),
            )));
        }
    }
}
