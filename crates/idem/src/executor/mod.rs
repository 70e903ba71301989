//! The executor: [`Idempotency::run`] wraps a handler so that
//! running it once or a hundred times for the same key has the effect of
//! running it once.

mod ahead;
mod builder;
mod claim;
mod classify;
mod context;
mod effect;
mod finish;
mod handler_error;
mod heartbeat;
mod held;
mod outcome;
mod replays;

use std::borrow::Cow;
use std::error::Error as StdError;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::codec::{AtRest, Codec, Json};
use crate::fingerprint::Fingerprint;
use crate::key::{LoggedKey, RecordId};
use crate::key_hash::KeyHasher;
use crate::metrics as m;
use crate::outbox::{OutboxConfig, Outgoing};
use crate::record::{ClaimParams, Failure, FailureClass, Lease};
use crate::step::StepRun;
use crate::store::{DeleteRecord, DynStepJournal, Store, StoreError};

pub use ahead::ClaimedAhead;
pub use builder::{
    ConfigError, IdempotencyBuilder, DEFAULT_LEASE, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_RETENTION,
};
pub(crate) use claim::Claimed;
pub use classify::{default_classifier, Backoff, Classifier, Terminal};
use context::Held;
pub use context::{Context, Heartbeats, OpenStep, StepStart};
pub use effect::{effect_in_doubt_of, effect_mark, effect_mark_fence, EFFECT_STEP};
pub use handler_error::HandlerError;
pub use held::{Begun, HeldRun};
use outcome::outcome_label;
pub use outcome::{Outcome, RunError};
use replays::Replays;
pub use replays::{DEFAULT_REPLAY_CACHE_BYTES, DEFAULT_REPLAY_CACHE_TTL};

/// How long to suggest waiting after a store error before trying again.
pub const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `from + d`, or [`LONGEST_HELD`](crate::store::LONGEST_HELD) from `from` if
/// that overflows: configuration may say `Duration::MAX` to mean "forever".
fn deadline(from: Instant, d: Duration) -> Instant {
    from.checked_add(d)
        .unwrap_or_else(|| from + crate::clock::LONGEST_HELD)
}

struct Config {
    lease: Duration,
    heartbeat: Duration,
    retention: Duration,
    failure_retention: Duration,
    max_attempts: NonZeroU32,
    backoff: Backoff,
    at_rest: AtRest,
    key_hasher: Option<KeyHasher>,
    max_response_bytes: usize,
    wait_for_in_flight: Option<Duration>,
    fail_open: bool,
    classifier: Classifier,
    log_keys: bool,
    journal: Option<Arc<dyn DynStepJournal>>,
    replays: Replays,
    outbox: Option<OutboxConfig>,
}

/// The executor: claims a key, runs the handler under a heartbeat, and
/// stores its outcome; replays the stored outcome to duplicates.
///
/// Defaults: lease 30 s, heartbeat every 10 s, retention 24 h, at most 5
/// attempts, responses compressed above 1 KiB and limited to 1 MiB, fail
/// closed, no waiting for in-flight duplicates, and duplicates of runs this
/// executor completed answered from memory for up to 60 s (64 MiB at most;
/// see [`IdempotencyBuilder::replay_cache_bytes`]).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use idem::{Idempotency, MemoryStore, Outcome, RecordId};
///
/// let idem = Idempotency::builder(MemoryStore::new()).build().unwrap();
/// let id = RecordId::parse("payments", "order-42:charge").unwrap();
///
/// let first = idem
///     .run(&id, None, |_ctx| async { Ok::<_, std::io::Error>(4200u64) })
///     .await
///     .unwrap();
/// assert!(matches!(first, Outcome::Executed { value: 4200, .. }));
///
/// // A redelivery does not run the handler again: the result is replayed.
/// let again = idem
///     .run(&id, None, |_ctx| async { Err(std::io::Error::other("never runs twice")) })
///     .await
///     .unwrap();
/// assert_eq!(again, Outcome::Replayed { value: 4200u64 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Idempotency<S, C = Json> {
    store: S,
    codec: C,
    config: Arc<Config>,
}

impl<S, C> std::fmt::Debug for Idempotency<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &std::any::type_name::<S>())
            .field("lease", &self.config.lease)
            .field("heartbeat", &self.config.heartbeat)
            .field("retention", &self.config.retention)
            .field("max_attempts", &self.config.max_attempts)
            .field("fail_open", &self.config.fail_open)
            .field("steps", &self.config.journal.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Clone, C: Clone> Clone for Idempotency<S, C> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            codec: self.codec.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: Store, C: Codec> Idempotency<S, C> {
    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The lease duration claims are made with.
    pub fn lease(&self) -> Duration {
        self.config.lease
    }

    /// The retention of completed records.
    pub fn retention(&self) -> Duration {
        self.config.retention
    }

    /// The retention of terminal failures.
    pub fn failure_retention(&self) -> Duration {
        self.config.failure_retention
    }

    /// Drops `id`'s replay from this executor's memory (see
    /// [`IdempotencyBuilder::replay_cache_bytes`]): call it when the record
    /// was deleted some other way and the key must run again at once.
    pub fn forget(&self, id: &RecordId) {
        self.forget_stored(&self.stored_id(id));
    }

    /// As [`forget`](Self::forget), for a record named as the store holds
    /// it (its key already hashed, if this executor hashes keys): what
    /// admin tools that list stored records have in hand.
    pub fn forget_stored(&self, stored: &RecordId) {
        self.config.replays.remove(stored);
    }

    /// The secret keys are hashed with, if the executor hashes them.
    pub fn key_hasher(&self) -> Option<&KeyHasher> {
        self.config.key_hasher.as_ref()
    }

    /// `id` as the store knows it: its key hashed when the executor hashes
    /// keys ([`IdempotencyBuilder::hash_keys`]), else `id` itself. For
    /// tools that read this executor's records from the store directly.
    pub fn stored_id<'a>(&self, id: &'a RecordId) -> Cow<'a, RecordId> {
        match &self.config.key_hasher {
            Some(hasher) => Cow::Owned(hasher.hash(id)),
            None => Cow::Borrowed(id),
        }
    }

    /// Deletes `id`'s record from the store and from this executor's
    /// memory: the key's next run executes. Whether there was a record.
    pub async fn delete(&self, id: &RecordId) -> Result<bool, StoreError>
    where
        S: DeleteRecord,
    {
        let stored = self.stored_id(id);
        let deleted = self.store.delete(&stored).await;
        self.config.replays.remove(&stored);
        deleted
    }

    /// How often a running handler's lease is extended.
    pub fn heartbeat_interval(&self) -> Duration {
        self.config.heartbeat
    }

    /// How many attempts a key gets before its failure is terminal.
    pub fn max_attempts(&self) -> NonZeroU32 {
        self.config.max_attempts
    }

    /// The backoff between retryable failures.
    pub fn backoff(&self) -> Backoff {
        self.config.backoff
    }

    /// The largest response stored, in bytes (encoded, before compression).
    pub fn max_response_bytes(&self) -> usize {
        self.config.max_response_bytes
    }

    /// How this executor keeps payloads at rest (compression, and the
    /// keyring that seals them, if any): what reads its records outside a
    /// run (`idem inspect`, `idem serve`'s record view) opens them with.
    pub fn at_rest(&self) -> &AtRest {
        &self.config.at_rest
    }

    /// The executor's outbox, if it has one.
    pub(crate) fn outbox_config(&self) -> Option<&OutboxConfig> {
        self.config.outbox.as_ref()
    }

    /// Runs `handler` at most once (in effect) for `id`.
    ///
    /// 1. Claims `id`. A completed record is replayed
    ///    ([`Outcome::Replayed`]); a stored failure is replayed
    ///    ([`RunError::Failed`]); a live claim elsewhere is
    ///    [`RunError::InProgress`] (or is waited for, if configured); a
    ///    different fingerprint is [`RunError::Mismatch`].
    /// 2. Runs the handler while a heartbeat extends the lease; if the lease
    ///    is lost the handler's [`Context`] says so.
    /// 3. Stores the encoded response, or records the failure as retryable
    ///    (released, with a backoff) or terminal (replayed).
    ///
    /// Dropping the returned future mid-run leaves the record as a crash
    /// would: the lease simply runs out and another worker takes over.
    pub async fn run<T, E, F, Fut>(
        &self,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_waiting(id, fingerprint, self.config.wait_for_in_flight, handler)
            .await
    }

    /// [`run`](Self::run), waiting up to `wait` (instead of the configured
    /// [`wait_for_in_flight`](IdempotencyBuilder::wait_for_in_flight)) for
    /// the outcome of a duplicate that is in progress elsewhere: woken by
    /// the store's notification where it has one, then claimed again; still
    /// in progress when `wait` runs out is [`RunError::InProgress`]. `None`
    /// or zero does not wait. Used for per-request waits such as HTTP's
    /// `Prefer: wait=N`.
    pub async fn run_waiting<T, E, F, Fut>(
        &self,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
        wait: Option<Duration>,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let id = &*self.stored_id(id);
        self.instrumented(id, async {
            let params = self.claim_params(fingerprint);
            match self.acquire(id, &params, self.config.fail_open, wait).await {
                Ok(Claimed::Held { lease, sent }) => {
                    self.execute(&lease, sent, fingerprint, handler).await
                }
                Ok(Claimed::Unguarded) => self.unguarded(id, handler).await,
                Ok(Claimed::Answered(outcome)) => self.replay(id, outcome).await,
                Err(error) => Err(RunError::Store(error)),
            }
        })
        .await
    }

    /// Runs `work` (one run of `id`) in the `idem.run` span, recording its
    /// outcome there. `work` is boxed first: a run's state is several
    /// kilobytes, and every future that holds it (a task, a consumer's
    /// delivery) would otherwise copy all of it each time it is moved.
    ///
    /// The span is at DEBUG, as the spans around it are: at the binaries'
    /// default `info` a span per run cost the gateway 5–10 µs of CPU a
    /// request (BENCHMARKS.md). The warnings a run logs name its scope and
    /// key themselves ([`logged_key`](Self::logged_key)).
    pub(crate) fn instrumented<'a, T, E>(
        &self,
        id: &RecordId,
        work: impl Future<Output = Result<Outcome<T>, RunError<E>>> + 'a,
    ) -> impl Future<Output = Result<Outcome<T>, RunError<E>>> + 'a {
        let span = tracing::debug_span!(
            "idem.run",
            scope = %id.scope(),
            key = %self.logged_key(id),
            attempt = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let work = Box::pin(work);
        async move {
            let result = work.instrument(span.clone()).await;
            span.record("outcome", outcome_label(&result));
            result
        }
    }

    /// How `id`'s key is written in logs: a short hash of it, or the key
    /// itself when the executor was built with `log_keys`.
    pub(crate) fn logged_key<'a>(&self, id: &'a RecordId) -> LoggedKey<'a> {
        id.logged(self.config.log_keys)
    }

    /// What this executor claims with.
    pub(crate) fn claim_params(&self, fingerprint: Option<Fingerprint>) -> ClaimParams {
        ClaimParams {
            fingerprint,
            lease: self.config.lease,
            retention: self.config.retention,
        }
    }

    /// The most a journaled value (a step's result, a durable input) may
    /// take.
    pub(crate) fn max_journaled_bytes(&self) -> usize {
        self.config.max_response_bytes
    }

    /// How long runs wait for an in-flight duplicate by default.
    pub(crate) fn waits_for_in_flight(&self) -> Option<Duration> {
        self.config.wait_for_in_flight
    }

    /// Whether runs go ahead unguarded when the store is unreachable.
    pub(crate) fn fails_open(&self) -> bool {
        self.config.fail_open
    }

    /// The step journal, if the store keeps one.
    pub(crate) fn journal(&self) -> Option<&Arc<dyn DynStepJournal>> {
        self.config.journal.as_ref()
    }

    /// Runs `handler` under `lease` (claimed at `sent`) with a heartbeat,
    /// and stores its outcome: steps 2 and 3 of [`Self::run`].
    pub(crate) async fn execute<T, E, F, Fut>(
        &self,
        lease: &Lease,
        sent: Instant,
        fingerprint: Option<Fingerprint>,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (ctx, held_tx) = self.open(lease, sent).await?;
        let steps = Arc::clone(&ctx.steps);
        let outgoing = Arc::clone(&ctx.outgoing);
        let result = {
            let work = handler(ctx);
            let beat = self.heartbeat(lease, sent, held_tx);
            tokio::pin!(work, beat);
            tokio::select! {
                biased;
                result = &mut work => result,
                never = &mut beat => match never {},
            }
        };
        self.close(lease, fingerprint, &steps, &outgoing, result)
            .await
    }

    /// Starts a run under `lease` (claimed at `sent`): its context, and
    /// the sender its heartbeat reports on. A lease past the attempts
    /// limit (earlier attempts never finished) ends as a terminal failure
    /// instead.
    async fn open<E>(
        &self,
        lease: &Lease,
        sent: Instant,
    ) -> Result<(Context, watch::Sender<Held>), RunError<E>> {
        tracing::Span::current().record("attempt", lease.attempt);
        let max = self.config.max_attempts.get();
        if lease.attempt > max {
            // Earlier attempts never finished (the worker crashed, was
            // killed or timed out): a poison message by another route.
            let failure = Failure::new(
                FailureClass::Terminal,
                format!(
                    "attempts exhausted ({} of {max}): earlier attempts never finished",
                    lease.attempt
                ),
            );
            tracing::warn!(
                scope = %lease.id.scope(),
                key = %self.logged_key(&lease.id),
                attempt = lease.attempt,
                "attempts exhausted without an outcome; recording a terminal failure"
            );
            self.record_failure(lease, failure.clone()).await;
            return Err(RunError::Failed(failure));
        }
        if lease.takeover {
            m::count(m::TAKEOVERS, &[]);
            tracing::warn!(
                scope = %lease.id.scope(),
                key = %self.logged_key(&lease.id),
                attempt = lease.attempt,
                "took over an expired lease; an earlier attempt may have partly run"
            );
        }
        let (held_tx, held) = watch::channel(Held::claimed(sent, self.config.lease));
        let steps = Arc::new(StepRun::new(
            lease.id.clone(),
            self.config.journal.clone(),
            self.config.max_response_bytes,
            self.config.at_rest.clone(),
            self.config.log_keys,
        ));
        let ctx = Context {
            lease: Some(lease.clone()),
            held,
            steps,
            outgoing: Arc::new(Outgoing::new(self.config.outbox.is_some())),
        };
        Ok((ctx, held_tx))
    }

    /// Ends a run under `lease` with the handler's `result`: parked if a
    /// step was in doubt under the park policy, else its response stored
    /// or its failure recorded.
    async fn close<T, E>(
        &self,
        lease: &Lease,
        fingerprint: Option<Fingerprint>,
        steps: &StepRun,
        outgoing: &Outgoing,
        result: Result<T, E>,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize,
        E: StdError + Send + Sync + 'static,
    {
        // Taken whatever the run's end: a failed or parked run sends
        // nothing, and a send after the end is refused.
        let messages = outgoing.take();
        if let Some(why) = steps.parked() {
            return Err(self.park(lease, why).await);
        }
        match result {
            Ok(value) => {
                self.store_success(lease, fingerprint, value, messages)
                    .await
            }
            Err(error) => Err(self.store_failure(lease, error).await),
        }
    }
}
