//! Delivery → key → executor → disposition: the [`Consumer`]; what it
//! decides is in [`decision`], how it is set up in [`builder`].

mod builder;
mod decision;
mod send_id;
mod unfit;

pub use builder::ConsumerBuilder;
pub use decision::{Acked, Decision, Disposition, Job, RetryCause, Stopped};

use std::error::Error as StdError;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use idem::{
    ClaimMany, ClaimedAhead, Codec, Context, FailureClass, Fingerprint, Idempotency, Json, Key,
    Outcome, RecordId, RunError, Scope, Store,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument as _;

use crate::ahead::ClaimAhead;
use crate::key::{KeyExtractor, KeySource};
use crate::metrics as m;
use crate::reconcile::Settled;
use crate::window::{RedeliveryWindow, WindowError};
use crate::Message;
use unfit::Unfit;

/// Counters of one consumer since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Deliveries whose handler ran and completed.
    pub executed: u64,
    /// Duplicates acknowledged with the stored outcome.
    pub replayed: u64,
    /// Deliveries handled without deduplication (fail-open).
    pub unguarded: u64,
    /// Deliveries given back because their key was in progress elsewhere.
    pub in_flight_conflicts: u64,
    /// Deliveries given back after a retryable failure, a lost lease or a
    /// store error.
    pub retries: u64,
    /// Deliveries dead-lettered.
    pub dead_letters: u64,
    /// Deliveries keyed by an id the broker assigns at each send
    /// ([`Message::message_id_per_send`]: SQS's `MessageId`, a Kafka
    /// record's position): the broker's redeliveries of one send are
    /// caught, a producer's second send of the same message is not.
    pub keyed_by_send_id: u64,
}

impl ConsumerStats {
    /// The share of completed deliveries that were duplicates:
    /// `replayed / (executed + replayed)`, 0 before any.
    pub fn duplicate_rate(&self) -> f64 {
        let done = self.executed + self.replayed;
        if done == 0 {
            0.0
        } else {
            self.replayed as f64 / done as f64
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    executed: AtomicU64,
    replayed: AtomicU64,
    unguarded: AtomicU64,
    in_flight_conflicts: AtomicU64,
    retries: AtomicU64,
    dead_letters: AtomicU64,
    keyed_by_send_id: AtomicU64,
}

/// The broker-agnostic consumer: reads a delivery's key, runs the handler
/// through the executor, and decides the disposition (docs/design.md §9):
///
/// | outcome | disposition |
/// |---|---|
/// | executed or replayed | [`Disposition::Ack`] |
/// | in progress elsewhere | [`Disposition::Retry`] after the other lease |
/// | retryable failure, attempts left | [`Disposition::Retry`] after the backoff |
/// | terminal failure, attempts exhausted, bad key, key reused with another payload | [`Disposition::DeadLetter`] with the reason |
/// | store unreachable | [`Disposition::Retry`] (fail-closed) |
///
/// While a handler runs, each heartbeat the store confirms also calls the
/// message's [`Message::keep_alive`], so the broker keeps the message for
/// exactly as long as the claim is held.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use idem::{Idempotency, MemoryStore, Scope};
/// use idem_consumer::{Acked, Consumer, Disposition, OwnedMessage};
/// use std::sync::Arc;
///
/// let idem = Idempotency::builder(MemoryStore::new()).build()?;
/// let consumer = Consumer::builder(idem, Scope::new("orders")?).build();
/// let message = Arc::new(OwnedMessage::new("{}").with_header("Idempotency-Key", "o-1"));
/// for expected in [Acked::Executed, Acked::Replayed] {
///     let decision = consumer
///         .process(Arc::clone(&message), |_job| async { Ok::<_, std::io::Error>(()) })
///         .await;
///     assert_eq!(decision.disposition, Disposition::Ack(expected));
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Consumer<S, C = Json> {
    inner: Arc<Inner<S, C>>,
}

impl<S, C> std::fmt::Debug for Consumer<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("idem", &self.inner.idem)
            .field("scope", &self.inner.scope)
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl<S, C> Clone for Consumer<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<S, C> {
    idem: Idempotency<S, C>,
    scope: Scope,
    keys: KeyExtractor,
    fingerprint: bool,
    name: Arc<str>,
    min_retry: Duration,
    max_retry: Duration,
    ahead: Option<ClaimAhead<S, C>>,
    reconciling: Option<crate::reconcile::Reconciling>,
    counters: Counters,
}

impl<S: Store, C: Codec> Consumer<S, C> {
    /// The executor.
    pub fn idempotency(&self) -> &Idempotency<S, C> {
        &self.inner.idem
    }

    /// The scope records are kept under.
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// The name in metrics and logs.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The reconciler, if the consumer was given one.
    pub(crate) fn reconciling(&self) -> Option<&crate::reconcile::Reconciling> {
        self.inner.reconciling.as_ref()
    }

    /// The longest delay a retried delivery is given.
    pub fn max_retry_delay(&self) -> Duration {
        self.inner.max_retry
    }

    /// Counters since the consumer was built.
    pub fn stats(&self) -> ConsumerStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConsumerStats {
            executed: get(&c.executed),
            replayed: get(&c.replayed),
            unguarded: get(&c.unguarded),
            in_flight_conflicts: get(&c.in_flight_conflicts),
            retries: get(&c.retries),
            dead_letters: get(&c.dead_letters),
            keyed_by_send_id: get(&c.keyed_by_send_id),
        }
    }

    /// Checks at start-up that records outlive every way the broker can
    /// deliver a message again: a completed record must still be there
    /// when the latest possible duplicate arrives, or that duplicate runs
    /// again.
    pub fn check_windows(&self, windows: &[RedeliveryWindow]) -> Result<(), WindowError> {
        crate::window::check(&self.inner.idem, windows)
    }

    /// Runs one delivery through key extraction and the executor and says
    /// what to do with it. Never panics on bad input: a delivery without a
    /// usable key, or whose payload the handler refuses as [`Terminal`](idem::Terminal),
    /// is a [`Disposition::DeadLetter`] with the reason.
    ///
    /// Each delivery runs in an `idem.delivery` span (DEBUG; the run's
    /// `idem.run` inside it) with the consumer's name, the message id and
    /// delivery count the broker gave, and the disposition.
    pub async fn process<M, T, E, H, Fut>(&self, message: Arc<M>, handler: H) -> Decision
    where
        M: Message,
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        H: FnOnce(Job<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = self.delivery_span(&*message);
        let work = async {
            match self.prepare(&*message) {
                Ok((id, fingerprint)) => {
                    self.run_job(message, id, Start::Claim(fingerprint), handler)
                        .await
                }
                Err(unfit) => {
                    tracing::warn!(consumer = %self.inner.name, reason = %unfit, "delivery dead-lettered before its claim");
                    self.decide(unfit.key(), dead_letter(unfit.to_string()))
                }
            }
        };
        work.instrument(span).await
    }

    /// The span of one delivery of `message`.
    fn delivery_span<M: Message>(&self, message: &M) -> tracing::Span {
        tracing::debug_span!(
            "idem.delivery",
            consumer = %self.inner.name,
            message_id = message.message_id(),
            delivery_count = message.delivery_count(),
            disposition = tracing::field::Empty,
        )
    }

    /// Claims the deliveries' keys in one round trip (the store's
    /// `claim_many`, see [`Idempotency::claim_ahead`]), for deliveries that
    /// are then processed one after another with
    /// [`process_claimed`](Self::process_claimed), soon: a partition's
    /// next records. One entry per message, `None` for a message without a
    /// usable key (give it to [`process`](Self::process), which
    /// dead-letters it).
    pub async fn claim_ahead<M: Message>(&self, messages: &[Arc<M>]) -> Vec<Option<ClaimedAhead>>
    where
        S: ClaimMany,
    {
        self.claim_with(messages, |runs| self.inner.idem.claim_ahead(runs))
            .await
    }

    /// [`claim_ahead`](Self::claim_ahead) for the deliveries that arrived
    /// together, when the consumer was built to
    /// [claim them together](ConsumerBuilder::claim_ahead); `None` when it
    /// was not.
    pub(crate) async fn claim_window<M: Message>(
        &self,
        messages: &[Arc<M>],
    ) -> Option<Vec<Option<ClaimedAhead>>> {
        let claim = self.inner.ahead?;
        Some(
            self.claim_with(messages, |runs| claim(&self.inner.idem, runs))
                .await,
        )
    }

    /// Whether [`claim_window`](Self::claim_window) claims.
    pub(crate) fn claims_ahead(&self) -> bool {
        self.inner.ahead.is_some()
    }

    /// The claims of `messages` by `claim` (one entry per message, `None`
    /// for a message without a usable key).
    async fn claim_with<M, F, Fut>(
        &self,
        messages: &[Arc<M>],
        claim: F,
    ) -> Vec<Option<ClaimedAhead>>
    where
        M: Message,
        F: FnOnce(Vec<(RecordId, Option<Fingerprint>)>) -> Fut,
        Fut: Future<Output = Vec<ClaimedAhead>>,
    {
        let prepared: Vec<Option<(RecordId, Option<Fingerprint>)>> =
            messages.iter().map(|m| self.prepare(&**m).ok()).collect();
        let mut claimed = claim(prepared.iter().flatten().cloned().collect())
            .await
            .into_iter();
        prepared
            .iter()
            .map(|p| p.as_ref().and_then(|_| claimed.next()))
            .collect()
    }

    /// [`process`](Self::process) with the claim
    /// [`claim_ahead`](Self::claim_ahead) made for this message.
    pub async fn process_claimed<M, T, E, H, Fut>(
        &self,
        message: Arc<M>,
        ahead: ClaimedAhead,
        handler: H,
    ) -> Decision
    where
        M: Message,
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        H: FnOnce(Job<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = self.delivery_span(&*message);
        let id = ahead.id().clone();
        let work = self.run_job(message, id, Start::Claimed(ahead), handler);
        work.instrument(span).await
    }

    /// A delivery's record id and fingerprint, or why it is dead-lettered
    /// before any claim: it has no usable key, or it is the broker's last
    /// delivery of the message.
    fn prepare<M: Message + ?Sized>(
        &self,
        message: &M,
    ) -> Result<(RecordId, Option<Fingerprint>), Unfit> {
        let inner = &*self.inner;
        let (key, source) = inner.keys.extract_from(message)?;
        if matches!(source, Some(KeySource::MessageId)) {
            if let Some(id) = message.message_id_per_send() {
                self.keyed_by_send_id(id);
            }
        }
        if let (Some(count), Some(last)) = (message.delivery_count(), message.last_delivery()) {
            if count >= last {
                return Err(Unfit::LastDelivery { count, key });
            }
        }
        let fingerprint = inner
            .fingerprint
            .then(|| payload_fingerprint(message.payload()));
        Ok((RecordId::new(inner.scope.clone(), key), fingerprint))
    }

    /// Runs the handler through the executor from `start` and decides the
    /// disposition.
    async fn run_job<M, T, E, H, Fut>(
        &self,
        message: Arc<M>,
        id: RecordId,
        start: Start,
        handler: H,
    ) -> Decision
    where
        M: Message,
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        H: FnOnce(Job<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let inner = &*self.inner;
        let key = id.key().clone();
        let name = Arc::clone(&inner.name);
        let ran = AtomicBool::new(false);
        let work = |ctx: Context| {
            ran.store(true, Ordering::Relaxed);
            let job = Job {
                id: id.clone(),
                message: Arc::clone(&message),
                ctx: ctx.clone(),
            };
            let message = Arc::clone(&message);
            async move {
                let started = Instant::now();
                let mut beats = ctx.heartbeats();
                let work = handler(job);
                tokio::pin!(work);
                let result = loop {
                    tokio::select! {
                        biased;
                        result = &mut work => break result,
                        () = beats.next() => message.keep_alive().await,
                    }
                };
                m::handler_seconds(&name, started.elapsed());
                result
            }
        };
        let run = match start {
            Start::Claim(fingerprint) => {
                AssertUnwindSafe(inner.idem.run(&id, fingerprint, work))
                    .catch_unwind()
                    .await
            }
            Start::Claimed(ahead) => {
                AssertUnwindSafe(inner.idem.run_claimed(ahead, work))
                    .catch_unwind()
                    .await
            }
        };
        let parked = match &run {
            Ok(Err(RunError::Parked(failure))) => Some(failure.message.clone()),
            Ok(Err(RunError::Failed(failure))) if failure.is_parked() => {
                Some(failure.message.clone())
            }
            _ => None,
        };
        let disposition = match run {
            Ok(Ok(Outcome::Executed { .. })) => Disposition::Ack(Acked::Executed),
            Ok(Ok(Outcome::Replayed { .. })) => Disposition::Ack(Acked::Replayed),
            Ok(Ok(Outcome::Unguarded { .. })) => Disposition::Ack(Acked::Unguarded),
            Ok(Err(error)) => self.on_error(error, ran.load(Ordering::Relaxed)),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-text panic".to_owned());
                tracing::error!(consumer = %inner.name, %message, "handler panicked");
                Disposition::Retry {
                    after: self.clamp(inner.idem.lease()),
                    cause: RetryCause::Panicked(message),
                }
            }
        };
        let disposition = match (&inner.reconciling, parked, disposition) {
            (Some(reconciling), Some(parked), Disposition::DeadLetter { reason }) => {
                let payload = bytes::Bytes::copy_from_slice(message.payload());
                // Boxed: a rare path, kept out of the delivery future's
                // layout (which callers nest in their own futures).
                let settled = Box::pin(reconciling.settle(
                    &inner.name,
                    &inner.idem,
                    &id,
                    &parked,
                    Some(payload),
                ));
                match settled.await {
                    Settled::Yes => Disposition::Retry {
                        after: inner.min_retry,
                        cause: RetryCause::Reconciled,
                    },
                    Settled::No(why) => dead_letter(format!("{reason} (reconciler: {why})")),
                }
            }
            (_, _, disposition) => disposition,
        };
        self.decide(Some(key), disposition)
    }

    /// The disposition for a run that ended in `error`; `ran` says whether
    /// the handler was called.
    fn on_error<E: StdError + 'static>(&self, error: RunError<E>, ran: bool) -> Disposition {
        match error {
            RunError::InProgress { retry_after } => Disposition::Retry {
                after: self.clamp(retry_after),
                cause: RetryCause::InProgress,
            },
            RunError::Handler {
                error,
                class: FailureClass::Retryable,
                attempt,
                retry_after,
            } => Disposition::Retry {
                after: self.clamp(retry_after.unwrap_or_default()),
                cause: RetryCause::Failed {
                    attempt,
                    error: idem::error_chain(&error),
                },
            },
            RunError::Handler { error, attempt, .. } => dead_letter(format!(
                "handler failed terminally on attempt {attempt}: {}",
                idem::error_chain(&error)
            )),
            RunError::Parked(failure) => dead_letter(format!(
                "{}; resolve it with `idem resolve`, then redeliver this message to resume",
                failure.message
            )),
            RunError::Failed(failure) if failure.is_parked() => dead_letter(format!(
                "parked for reconciliation: {}; resolve it with `idem resolve`, then redeliver \
                 this message to resume",
                failure.message
            )),
            RunError::Failed(failure) => dead_letter(format!(
                "stored {} failure, replayed: {}",
                failure.class, failure.message
            )),
            RunError::Mismatch => {
                dead_letter("idempotency key was already used with a different payload".to_owned())
            }
            RunError::Forgotten { age } => dead_letter(format!(
                "delivered again after its idempotency record expired (it ran about {}s ago, \
                 and the store remembers only that it did): not run a second time",
                age.as_secs()
            )),
            RunError::LeaseLost => Disposition::Retry {
                after: self.inner.min_retry,
                cause: RetryCause::LeaseLost,
            },
            RunError::Store(error) => Disposition::Retry {
                after: self.clamp(idem::STORE_RETRY_AFTER),
                cause: if ran {
                    RetryCause::Unstored(idem::error_chain(&error))
                } else {
                    RetryCause::Store(idem::error_chain(&error))
                },
            },
            RunError::Decode { reason } => {
                // The record says the work completed; only its stored result
                // is unreadable (a changed result type). Redelivering cannot
                // change that, and running again would duplicate the effect.
                tracing::error!(
                    consumer = %self.inner.name,
                    %reason,
                    "completed record's result does not decode; acknowledging as a duplicate"
                );
                Disposition::Ack(Acked::Replayed)
            }
            other => dead_letter(idem::error_chain(&other)),
        }
    }

    fn clamp(&self, delay: Duration) -> Duration {
        delay.clamp(self.inner.min_retry, self.inner.max_retry)
    }

    fn decide(&self, key: Option<Key>, disposition: Disposition) -> Decision {
        let c = &self.inner.counters;
        let (counter, label) = match &disposition {
            Disposition::Ack(Acked::Executed) => (&c.executed, "executed"),
            Disposition::Ack(Acked::Replayed) => (&c.replayed, "replayed"),
            Disposition::Ack(Acked::Unguarded) => (&c.unguarded, "unguarded"),
            Disposition::Retry {
                cause: RetryCause::InProgress,
                ..
            } => (&c.in_flight_conflicts, "in_progress"),
            Disposition::Retry { .. } => (&c.retries, "retry"),
            Disposition::DeadLetter { .. } => (&c.dead_letters, "dead_letter"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        // The delivery's span, when called inside it.
        tracing::Span::current().record("disposition", label);
        m::delivery(&self.inner.name, label, self.stats().duplicate_rate());
        if let Disposition::Retry { after, cause } = &disposition {
            tracing::debug!(consumer = %self.inner.name, ?after, %cause, "delivery to be retried");
        }
        if let Disposition::DeadLetter { reason } = &disposition {
            tracing::warn!(consumer = %self.inner.name, %reason, "delivery dead-lettered");
        }
        Decision { key, disposition }
    }
}

/// Where a run starts: a claim now, or one made ahead.
enum Start {
    Claim(Option<Fingerprint>),
    Claimed(ClaimedAhead),
}

fn dead_letter(reason: String) -> Disposition {
    Disposition::DeadLetter { reason }
}

/// The payload's fingerprint: canonical JSON when it parses, bytes
/// otherwise.
fn payload_fingerprint(payload: &[u8]) -> Fingerprint {
    Fingerprint::of_json(payload).unwrap_or_else(|_| Fingerprint::of_bytes(payload))
}
