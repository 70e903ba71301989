//! The executor: [`Idempotency::run`] wraps a handler so that
//! running it once or a hundred times for the same key has the effect of
//! running it once.

use std::convert::Infallible;
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

use crate::codec::{self, Codec, Json};
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;
use crate::machine::LeaseLost;
use crate::metrics as m;
use crate::record::{ClaimOutcome, ClaimParams, Failure, FailureClass, Lease};
use crate::step::StepRun;
use crate::store::{BoxError, ClaimMany, DynStepJournal, Store, StoreError};

/// Failure messages are cut to this many bytes when the store refuses the
/// whole message.
const SHORT_FAILURE: usize = 256;

/// `message`, cut at a character boundary to fit [`SHORT_FAILURE`] with a
/// mark that it was cut.
fn cut_short(message: &str) -> String {
    const MARK: &str = " [cut short]";
    if message.len() <= SHORT_FAILURE - MARK.len() {
        return message.to_owned();
    }
    let mut end = SHORT_FAILURE - MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &message[..end])
}

/// How long to suggest waiting after a store error before trying again.
pub const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `from + d`, or [`LONGEST_HELD`](crate::LONGEST_HELD) from `from` if
/// that overflows: configuration may say `Duration::MAX` to mean "forever".
fn deadline(from: Instant, d: Duration) -> Instant {
    from.checked_add(d)
        .unwrap_or_else(|| from + crate::clock::LONGEST_HELD)
}

/// Decides whether a handler's error is worth retrying.
pub type Classifier = Arc<dyn Fn(&(dyn StdError + 'static)) -> FailureClass + Send + Sync>;

/// Marks an error as terminal for the default classifier: return it (or
/// an error whose `source()` chain contains it) from a handler and the
/// failure is recorded and replayed instead of retried.
///
/// ```
/// let e = idem::Terminal::new("card declined");
/// assert_eq!(e.to_string(), "card declined");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Terminal {
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl Terminal {
    /// A terminal error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    /// A terminal error wrapping another error.
    pub fn wrap(source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Self {
            message: source.to_string(),
            source: Some(source),
        }
    }
}

/// The default classifier: terminal if the error or any of its sources is
/// a [`Terminal`], retryable otherwise (the max-attempts limit turns a
/// poison message into a terminal failure).
pub fn default_classifier(error: &(dyn StdError + 'static)) -> FailureClass {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<Terminal>() {
            return FailureClass::Terminal;
        }
        current = e.source();
    }
    FailureClass::Retryable
}

/// Exponential backoff with jitter, for the `retry_after` of retryable
/// failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// 200 ms, doubling per attempt, capped at 5 minutes.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// Backoff starting at `initial`, doubling per attempt, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
        }
    }

    /// The longest delay this backoff gives.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay after failed attempt `attempt` (1-based): the capped
    /// exponential value with "equal jitter" (uniform in its upper half), so
    /// it never collapses to zero and herds are spread.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let base = self
            .initial
            .saturating_mul(1u32 << exp.min(31))
            .min(self.max);
        let half = base / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(rand::random_range(0..=jitter_ns))
    }
}

/// A configuration the executor refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The lease was zero.
    #[error("lease must be longer than zero")]
    ZeroLease,
    /// The heartbeat would not beat before the lease runs out.
    #[error("heartbeat interval {heartbeat:?} must be shorter than the lease {lease:?}")]
    HeartbeatTooSlow {
        /// The interval given.
        heartbeat: Duration,
        /// The lease.
        lease: Duration,
    },
    /// Records would be dropped while their lease is still live.
    #[error("retention {retention:?} must be at least the lease {lease:?}")]
    RetentionShorterThanLease {
        /// The retention given.
        retention: Duration,
        /// The lease.
        lease: Duration,
    },
    /// A [`Durable`](crate::durable::Durable) handler needs a store that
    /// keeps a step journal (its input is journaled there).
    #[error("durable handlers need a store with a step journal; this store keeps none")]
    NoStepJournal,
}

struct Config {
    lease: Duration,
    heartbeat: Duration,
    retention: Duration,
    failure_retention: Duration,
    max_attempts: NonZeroU32,
    backoff: Backoff,
    compress_above: usize,
    max_response_bytes: usize,
    wait_for_in_flight: Option<Duration>,
    fail_open: bool,
    classifier: Classifier,
    log_keys: bool,
    journal: Option<Arc<dyn DynStepJournal>>,
}

/// Builds an [`Idempotency`]; see its docs for the defaults.
pub struct IdempotencyBuilder<S, C = Json> {
    store: S,
    codec: C,
    lease: Duration,
    heartbeat: Option<Duration>,
    retention: Duration,
    failure_retention: Option<Duration>,
    max_attempts: NonZeroU32,
    backoff: Backoff,
    compress_above: usize,
    max_response_bytes: usize,
    wait_for_in_flight: Option<Duration>,
    fail_open: bool,
    classifier: Classifier,
    log_keys: bool,
}

impl<S: Store, C: Codec> IdempotencyBuilder<S, C> {
    /// How long a claim lasts without a heartbeat (default 30 s). A worker
    /// that dies is taken over this long after its last heartbeat.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often the lease is extended while the handler runs (default a
    /// third of the lease).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }

    /// How long completed records (and abandoned claims) are kept and
    /// replayed (default 24 h). Must exceed any redelivery window. Any
    /// duration up to `Duration::MAX` ("forever") works on every store;
    /// stores keep at most [`LONGEST_HELD`](crate::LONGEST_HELD), a
    /// century.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long terminal failures are kept and replayed (default: the
    /// retention).
    pub fn failure_retention(mut self, retention: Duration) -> Self {
        self.failure_retention = Some(retention);
        self
    }

    /// After this many attempts a retryable failure is recorded as
    /// terminal (default 5): a poison message stops being retried.
    pub fn max_attempts(mut self, attempts: NonZeroU32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The backoff suggested after retryable failures.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Responses longer than this (encoded, in bytes) are stored
    /// zstd-compressed (default 1024).
    pub fn compress_above(mut self, bytes: usize) -> Self {
        self.compress_above = bytes;
        self
    }

    /// The largest encoded response that may be stored (default 1 MiB).
    /// A larger one is recorded as a terminal failure and reported as
    /// [`RunError::ResponseTooLarge`]: the handler's effect happened, so it
    /// must not run again.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// When the key is in progress elsewhere, wait up to `max` for that
    /// outcome (notified by the store where it can) instead of returning
    /// [`RunError::InProgress`] at once.
    pub fn wait_for_in_flight(mut self, max: Duration) -> Self {
        self.wait_for_in_flight = Some(max);
        self
    }

    /// Run the handler without protection when the store cannot be
    /// reached (default `false`: fail closed, the handler does not run).
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// Classifies handler errors (default [`default_classifier`]).
    pub fn classify(
        mut self,
        classifier: impl Fn(&(dyn StdError + 'static)) -> FailureClass + Send + Sync + 'static,
    ) -> Self {
        self.classifier = Arc::new(classifier);
        self
    }

    /// Log keys verbatim instead of as a short hash (default `false`).
    pub fn log_keys(mut self, log_keys: bool) -> Self {
        self.log_keys = log_keys;
        self
    }

    /// Encodes responses with `codec` instead of JSON.
    pub fn codec<C2: Codec>(self, codec: C2) -> IdempotencyBuilder<S, C2> {
        IdempotencyBuilder {
            store: self.store,
            codec,
            lease: self.lease,
            heartbeat: self.heartbeat,
            retention: self.retention,
            failure_retention: self.failure_retention,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            compress_above: self.compress_above,
            max_response_bytes: self.max_response_bytes,
            wait_for_in_flight: self.wait_for_in_flight,
            fail_open: self.fail_open,
            classifier: self.classifier,
            log_keys: self.log_keys,
        }
    }

    /// Checks the configuration and builds the executor.
    pub fn build(self) -> Result<Idempotency<S, C>, ConfigError> {
        if self.lease.is_zero() {
            return Err(ConfigError::ZeroLease);
        }
        let heartbeat = self.heartbeat.unwrap_or(self.lease / 3);
        if heartbeat.is_zero() || heartbeat >= self.lease {
            return Err(ConfigError::HeartbeatTooSlow {
                heartbeat,
                lease: self.lease,
            });
        }
        let failure_retention = self.failure_retention.unwrap_or(self.retention);
        for retention in [self.retention, failure_retention] {
            if retention < self.lease {
                return Err(ConfigError::RetentionShorterThanLease {
                    retention,
                    lease: self.lease,
                });
            }
        }
        let journal = self.store.step_journal();
        Ok(Idempotency {
            store: self.store,
            codec: self.codec,
            config: Arc::new(Config {
                journal,
                lease: self.lease,
                heartbeat,
                retention: self.retention,
                failure_retention,
                max_attempts: self.max_attempts,
                backoff: self.backoff,
                compress_above: self.compress_above,
                max_response_bytes: self.max_response_bytes,
                wait_for_in_flight: self.wait_for_in_flight,
                fail_open: self.fail_open,
                classifier: self.classifier,
                log_keys: self.log_keys,
            }),
        })
    }
}

/// The executor: claims a key, runs the handler under a heartbeat, and
/// stores its outcome; replays the stored outcome to duplicates.
///
/// Defaults: lease 30 s, heartbeat every 10 s, retention 24 h, at most 5
/// attempts, responses compressed above 1 KiB and limited to 1 MiB, fail
/// closed, no waiting for in-flight duplicates.
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

impl<S: Clone, C: Clone> Clone for Idempotency<S, C> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            codec: self.codec.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: Store> Idempotency<S, Json> {
    /// Starts configuring an executor over `store`.
    pub fn builder(store: S) -> IdempotencyBuilder<S, Json> {
        IdempotencyBuilder {
            store,
            codec: Json,
            lease: Duration::from_secs(30),
            heartbeat: None,
            retention: Duration::from_secs(24 * 3600),
            failure_retention: None,
            max_attempts: NonZeroU32::new(5).expect("5 is not zero"),
            backoff: Backoff::default(),
            compress_above: 1024,
            max_response_bytes: 1 << 20,
            wait_for_in_flight: None,
            fail_open: false,
            classifier: Arc::new(default_classifier),
            log_keys: false,
        }
    }
}

/// What a successful [`Idempotency::run`] did. Executed and replayed
/// results are distinguished everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The handler ran now and its result was stored.
    Executed {
        /// The handler's result.
        value: T,
        /// Which attempt ran it (1 for the first).
        attempt: u32,
        /// Whether this run took over from a worker whose lease expired:
        /// that earlier attempt may have partly run.
        takeover: bool,
    },
    /// The handler had already completed for this key; this is its stored
    /// result and nothing ran.
    Replayed {
        /// The stored result.
        value: T,
    },
    /// The store could not be reached and the executor was configured to
    /// fail open: the handler ran without any deduplication.
    Unguarded {
        /// The handler's result.
        value: T,
    },
}

impl<T> Outcome<T> {
    /// The result, however it was obtained.
    pub fn value(&self) -> &T {
        match self {
            Outcome::Executed { value, .. }
            | Outcome::Replayed { value }
            | Outcome::Unguarded { value } => value,
        }
    }

    /// The result, however it was obtained.
    pub fn into_value(self) -> T {
        match self {
            Outcome::Executed { value, .. }
            | Outcome::Replayed { value }
            | Outcome::Unguarded { value } => value,
        }
    }

    /// Whether this is a replay of an earlier execution.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed { .. })
    }
}

/// Why [`Idempotency::run`] returned no value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError<E> {
    /// Another worker holds a live claim on this key. Nothing ran; try
    /// again after `retry_after`.
    #[error("request with this key is in progress elsewhere; retry after {retry_after:?}")]
    InProgress {
        /// Until the other claim's lease runs out.
        retry_after: Duration,
    },
    /// The key was used before with a different fingerprint. Nothing ran.
    #[error("key was already used with a different request fingerprint")]
    Mismatch,
    /// The handler ran now and failed; the failure was recorded.
    #[error("handler failed on attempt {attempt} ({class})")]
    Handler {
        /// The handler's error.
        #[source]
        error: E,
        /// How it was classified (after the max-attempts rule).
        class: FailureClass,
        /// Which attempt this was.
        attempt: u32,
        /// For retryable failures, the backoff before the next attempt.
        retry_after: Option<Duration>,
    },
    /// The handler failed for good on an earlier attempt; this is the
    /// stored failure, replayed. Nothing ran.
    #[error("replayed stored failure ({}): {}", .0.class, .0.message)]
    Failed(Failure),
    /// The handler ran but its response was too large to store; this was
    /// recorded as a terminal failure so it will not run again.
    #[error("response of {size} bytes exceeds the limit of {limit} bytes")]
    ResponseTooLarge {
        /// The encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The handler ran but its response could not be encoded; recorded as a
    /// terminal failure.
    #[error("response could not be encoded")]
    Encode(#[source] BoxError),
    /// A step of the handler was in doubt under the
    /// [`Park`](crate::step::Park) policy: the record is parked (failed,
    /// outcome unknown) until an operator resolves it. Later claims replay
    /// it as [`RunError::Failed`] with [`FailureClass::Unknown`].
    #[error("parked for reconciliation: {}", .0.message)]
    Parked(Failure),
    /// The stored response could not be decoded into the requested type.
    #[error("stored response could not be decoded: {reason}")]
    Decode {
        /// What went wrong.
        reason: String,
    },
    /// The handler ran, but its lease was taken over before the outcome
    /// could be stored; the new holder's outcome wins.
    #[error("lease lost before the outcome was stored")]
    LeaseLost,
    /// The store failed (fail-closed: if this happened at the claim, the
    /// handler did not run).
    #[error("idempotency store error")]
    Store(#[source] StoreError),
    /// A [`Durable`](crate::durable::Durable) run's input could not be
    /// journaled (it does not encode as JSON, or is over the size limit).
    /// Nothing was claimed and nothing ran.
    #[error("input could not be journaled: {reason}")]
    Input {
        /// What went wrong.
        reason: String,
    },
}

impl<E> RunError<E> {
    /// When it makes sense to try again, if ever: for in-progress keys,
    /// retryable failures and store errors.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RunError::InProgress { retry_after } => Some(*retry_after),
            RunError::Handler { retry_after, .. } => *retry_after,
            RunError::Store(_) => Some(STORE_RETRY_AFTER),
            _ => None,
        }
    }
}

/// Where a claim left a run.
pub(crate) enum Claimed {
    /// Acquired: the lease, and when its claim was sent.
    Held {
        /// The lease.
        lease: Lease,
        /// When the claim was sent (the lease is measured from here).
        sent: Instant,
    },
    /// The store is unreachable and the executor fails open.
    Unguarded,
    /// Not acquired: see [`Idempotency::answer`].
    Answered(ClaimOutcome),
}

/// What a handler is told about its run.
#[derive(Debug, Clone)]
pub struct Context {
    lease: Option<Lease>,
    lost: watch::Receiver<bool>,
    beats: watch::Receiver<u64>,
    pub(crate) steps: Arc<StepRun>,
}

impl Context {
    /// The lease held, or `None` when running unguarded (fail-open).
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// This run's fencing number, to pass to downstream writes that can
    /// reject an older holder's writes. `None` when unguarded.
    pub fn fence(&self) -> Option<u64> {
        self.lease.as_ref().map(|l| l.fence)
    }

    /// Which attempt this is (1 for the first; 0 when unguarded).
    pub fn attempt(&self) -> u32 {
        self.lease.as_ref().map_or(0, |l| l.attempt)
    }

    /// Whether this run took over from a worker whose lease expired: an
    /// earlier attempt may have partly run.
    pub fn is_takeover(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| l.takeover)
    }

    /// Whether the lease is known to be lost (taken over, or not
    /// confirmed by a heartbeat before it ran out).
    pub fn is_lease_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Check this before an irreversible step: `Err` once the lease is
    /// known to be lost, when another worker may be running the same work.
    pub fn ensure_lease(&self) -> Result<(), LeaseLost> {
        if self.is_lease_lost() {
            Err(LeaseLost)
        } else {
            Ok(())
        }
    }

    /// Resolves when the lease is lost (never, if it is not).
    pub async fn lease_lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|l| *l).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// A stream of the heartbeat's confirmed extensions: each call to
    /// [`Heartbeats::next`] resolves after the store next confirms that
    /// this run's lease was extended. It never resolves once the lease is
    /// lost, or when running unguarded.
    ///
    /// Brokers use this to tell their own redelivery timer that the work
    /// is still alive (JetStream in-progress acks, SQS visibility), so the
    /// broker keeps the message for exactly as long as the claim is held.
    pub fn heartbeats(&self) -> Heartbeats {
        let mut beats = self.beats.clone();
        beats.mark_unchanged();
        Heartbeats {
            beats,
            lost: self.lost.clone(),
        }
    }
}

/// Confirmed lease extensions of one run; see [`Context::heartbeats`].
#[derive(Debug)]
pub struct Heartbeats {
    beats: watch::Receiver<u64>,
    lost: watch::Receiver<bool>,
}

impl Heartbeats {
    /// Resolves after the next confirmed extension while the lease is
    /// held; pending forever once it is lost or the run has ended.
    pub async fn next(&mut self) {
        loop {
            if self.beats.changed().await.is_err() {
                return std::future::pending().await;
            }
            if !*self.lost.borrow() {
                return;
            }
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
        self.instrumented(id, async {
            let params = self.claim_params(fingerprint);
            match self.acquire(id, &params, self.config.fail_open, wait).await {
                Ok(Claimed::Held { lease, sent }) => {
                    self.execute(&lease, sent, &params, handler).await
                }
                Ok(Claimed::Unguarded) => self.unguarded(id, handler).await,
                Ok(Claimed::Answered(outcome)) => self.answer(outcome),
                Err(error) => Err(RunError::Store(error)),
            }
        })
        .await
    }

    /// Runs `work` (one run of `id`) in the `idem.run` span, recording its
    /// outcome there. `work` is boxed first: a run's state is several
    /// kilobytes, and every future that holds it (a task, a consumer's
    /// delivery) would otherwise copy all of it each time it is moved.
    pub(crate) fn instrumented<'a, T, E>(
        &self,
        id: &RecordId,
        work: impl Future<Output = Result<Outcome<T>, RunError<E>>> + 'a,
    ) -> impl Future<Output = Result<Outcome<T>, RunError<E>>> + 'a {
        let span = tracing::info_span!(
            "idem.run",
            scope = %id.scope(),
            key = tracing::field::Empty,
            attempt = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        // The key's hash is only worked out for a span that is recorded.
        if !span.is_disabled() {
            let key = if self.config.log_keys {
                id.key().to_string()
            } else {
                id.log_hash()
            };
            span.record("key", key.as_str());
        }
        let work = Box::pin(work);
        async move {
            let result = work.instrument(span.clone()).await;
            span.record("outcome", outcome_label(&result));
            result
        }
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

    /// Claims `id`, waiting up to `wait` for an in-flight duplicate. A
    /// store error with `fail_open` set is [`Claimed::Unguarded`].
    pub(crate) async fn acquire(
        &self,
        id: &RecordId,
        params: &ClaimParams,
        fail_open: bool,
        wait: Option<Duration>,
    ) -> Result<Claimed, StoreError> {
        let wait_until = wait.map(|w| deadline(Instant::now(), w));
        loop {
            let outcome = match self.claim_once(id, params).await {
                Ok(Claimed::Answered(outcome)) => outcome,
                Err(error @ StoreError::Unavailable(_)) if fail_open => {
                    tracing::warn!(%error, "store unreachable; running unguarded (fail-open)");
                    m::count(m::FAIL_OPEN, &[]);
                    return Ok(Claimed::Unguarded);
                }
                other => return other,
            };
            match outcome {
                ClaimOutcome::InProgress { retry_after } => {
                    let remaining = wait_until.map_or(Duration::ZERO, |until| {
                        until.saturating_duration_since(Instant::now())
                    });
                    if remaining.is_zero() {
                        return Ok(Claimed::Answered(outcome));
                    }
                    self.store
                        .wait_for_change(id, retry_after.min(remaining))
                        .await;
                }
                other => return Ok(Claimed::Answered(other)),
            }
        }
    }

    /// One claim of `id`: held, or the store's answer.
    pub(crate) async fn claim_once(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<Claimed, StoreError> {
        let sent = Instant::now();
        let outcome = m::timed(m::OP_CLAIM, self.store.claim(id, params)).await?;
        m::count(m::CLAIMS, &[("outcome", outcome.label())]);
        Ok(match outcome {
            ClaimOutcome::Acquired(lease) => Claimed::Held { lease, sent },
            other => Claimed::Answered(other),
        })
    }

    /// What a claim that did not acquire means to the caller.
    pub(crate) fn answer<T: DeserializeOwned, E>(
        &self,
        outcome: ClaimOutcome,
    ) -> Result<Outcome<T>, RunError<E>> {
        match outcome {
            ClaimOutcome::Acquired(_) => unreachable!("an acquired claim is held, not answered"),
            ClaimOutcome::Completed(stored) => {
                m::count(m::REPLAYS, &[]);
                self.decode(&stored)
                    .map(|value| Outcome::Replayed { value })
            }
            ClaimOutcome::Failed(failure) => {
                m::count(m::REPLAYS, &[]);
                Err(RunError::Failed(failure))
            }
            ClaimOutcome::Mismatch => {
                m::count(m::MISMATCHES, &[]);
                Err(RunError::Mismatch)
            }
            ClaimOutcome::InProgress { retry_after } => Err(RunError::InProgress { retry_after }),
        }
    }

    /// Runs `handler` with no claim (fail-open, the store unreachable).
    pub(crate) async fn unguarded<T, E, F, Fut>(
        &self,
        id: &RecordId,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let (_tx, lost) = watch::channel(false);
        let (_beat_tx, beats) = watch::channel(0);
        let value = handler(Context {
            lease: None,
            lost,
            beats,
            steps: Arc::new(StepRun::new(id.clone(), None, 0)),
        })
        .await
        .map_err(|error| RunError::Handler {
            class: (self.config.classifier)(&error),
            error,
            attempt: 0,
            retry_after: None,
        })?;
        Ok(Outcome::Unguarded { value })
    }

    /// Runs `handler` under `lease` (claimed at `sent`) with a heartbeat,
    /// and stores its outcome: steps 2 and 3 of [`Self::run`].
    pub(crate) async fn execute<T, E, F, Fut>(
        &self,
        lease: &Lease,
        sent: Instant,
        params: &ClaimParams,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
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
                attempt = lease.attempt,
                "attempts exhausted without an outcome; recording a terminal failure"
            );
            self.record_failure(lease, failure.clone()).await;
            return Err(RunError::Failed(failure));
        }
        if lease.takeover {
            m::count(m::TAKEOVERS, &[]);
            tracing::warn!(
                attempt = lease.attempt,
                "took over an expired lease; an earlier attempt may have partly run"
            );
        }
        let (lost_tx, lost) = watch::channel(false);
        let (beat_tx, beats) = watch::channel(0);
        let steps = Arc::new(StepRun::new(
            lease.id.clone(),
            self.config.journal.clone(),
            self.config.max_response_bytes,
        ));
        let ctx = Context {
            lease: Some(lease.clone()),
            lost,
            beats,
            steps: Arc::clone(&steps),
        };
        let result = {
            let work = handler(ctx);
            let beat = self.heartbeat(lease, sent, lost_tx, beat_tx);
            tokio::pin!(work, beat);
            tokio::select! {
                biased;
                result = &mut work => result,
                never = &mut beat => match never {},
            }
        };
        if let Some(why) = steps.parked() {
            return Err(self.park(lease, why).await);
        }
        match result {
            Ok(value) => self.store_success(lease, params, value).await,
            Err(error) => Err(self.store_failure(lease, error).await),
        }
    }

    /// Ends a run whose [`Park`](crate::step::Park) step was in doubt: the
    /// record is kept as failed with an unknown outcome until an operator
    /// resolves it, whatever the handler returned.
    async fn park<E>(&self, lease: &Lease, why: String) -> RunError<E> {
        m::count(m::PARKED, &[]);
        m::count(m::EXECUTIONS, &[("result", FailureClass::Unknown.as_str())]);
        tracing::warn!(attempt = lease.attempt, %why, "parking the record for reconciliation");
        let failure = Failure::new(FailureClass::Unknown, why);
        self.record_failure(lease, failure.clone()).await;
        RunError::Parked(failure)
    }

    /// Extends the lease every heartbeat interval, and raises the lost flag
    /// as soon as the lease is known or feared lost: when the store says so,
    /// or when the lease as last confirmed runs out (measured conservatively
    /// from when the confirming request was sent) before an extension is
    /// confirmed, even if the store has not answered at all.
    async fn heartbeat(
        &self,
        lease: &Lease,
        claim_sent: Instant,
        lost: watch::Sender<bool>,
        beats: watch::Sender<u64>,
    ) -> Infallible {
        let lease_len = self.config.lease;
        let every = self.config.heartbeat;
        let mut confirmed_until = deadline(claim_sent, lease_len);
        let mut next_beat = deadline(claim_sent, every);
        let flag = |why: &'static str| {
            if !lost.send_replace(true) {
                m::count(m::LEASE_LOST, &[("at", "heartbeat")]);
                tracing::warn!(why, "lease lost");
            }
        };
        loop {
            let flagged = *lost.borrow();
            let wake = if flagged {
                next_beat
            } else {
                next_beat.min(confirmed_until)
            };
            tokio::time::sleep_until(wake).await;
            if !flagged && Instant::now() >= confirmed_until {
                flag("no extension was confirmed before the lease ran out");
            }
            if Instant::now() < next_beat {
                continue;
            }
            let sent = Instant::now();
            let extend = m::timed(m::OP_EXTEND, self.store.extend(lease, lease_len));
            tokio::pin!(extend);
            let result = if *lost.borrow() {
                extend.await
            } else {
                tokio::select! {
                    result = &mut extend => result,
                    () = tokio::time::sleep_until(confirmed_until) => {
                        flag("the store did not confirm an extension before the lease ran out");
                        extend.await
                    }
                }
            };
            next_beat = deadline(Instant::now(), every);
            match result {
                Ok(_) => {
                    confirmed_until = deadline(sent, lease_len);
                    if !*lost.borrow() {
                        beats.send_modify(|n| *n += 1);
                    }
                }
                Err(StoreError::LeaseLost) => {
                    flag("another worker took over");
                    return std::future::pending().await;
                }
                Err(error) => tracing::warn!(%error, "heartbeat failed"),
            }
        }
    }

    async fn store_success<T: Serialize, E>(
        &self,
        lease: &Lease,
        params: &ClaimParams,
        value: T,
    ) -> Result<Outcome<T>, RunError<E>> {
        let encoded = match self.codec.encode(&value) {
            Ok(encoded) => encoded,
            Err(error) => {
                let failure = Failure::new(
                    FailureClass::Terminal,
                    format!("response could not be encoded: {error}"),
                );
                self.record_failure(lease, failure).await;
                return Err(RunError::Encode(error));
            }
        };
        let limit = self.config.max_response_bytes;
        if encoded.len() > limit {
            let size = encoded.len();
            let failure = Failure::new(
                FailureClass::Terminal,
                format!("response of {size} bytes exceeds the limit of {limit} bytes"),
            );
            self.record_failure(lease, failure).await;
            return Err(RunError::ResponseTooLarge { size, limit });
        }
        let sealed = codec::seal(encoded, self.config.compress_above);
        let retention = self.config.retention;
        let (stored, uncertain) = self
            .with_store_retries(
                lease,
                || self.store.complete(lease, sealed.clone(), retention),
                m::OP_COMPLETE,
            )
            .await;
        let stored = match stored {
            // An earlier try may have been applied before the store became
            // unreachable: then the record holds exactly these bytes.
            Err(StoreError::LeaseLost)
                if uncertain && self.stored_already(lease, params, &sealed).await =>
            {
                Ok(())
            }
            other => other,
        };
        match stored {
            Ok(()) => {
                m::count(m::EXECUTIONS, &[("result", "ok")]);
                Ok(Outcome::Executed {
                    value,
                    attempt: lease.attempt,
                    takeover: lease.takeover,
                })
            }
            Err(StoreError::LeaseLost) => {
                m::count(m::LEASE_LOST, &[("at", "complete")]);
                tracing::warn!(
                    "handler finished after its lease was taken over; its outcome was not stored"
                );
                Err(RunError::LeaseLost)
            }
            Err(error @ StoreError::Unavailable(_)) => Err(RunError::Store(error)),
            Err(refused) => {
                // The store answered and said no (too large, invalid,
                // corrupt): left in progress, the claim would be taken
                // over and the handler run again (DESIGN §5.5).
                tracing::error!(error = %refused, "the store refused the response; recording a terminal failure");
                let failure = Failure::new(
                    FailureClass::Terminal,
                    format!(
                        "the handler ran, but the store refused its response: {}",
                        crate::error_chain(&refused)
                    ),
                );
                self.record_failure(lease, failure).await;
                Err(RunError::Store(refused))
            }
        }
    }

    async fn store_failure<E: StdError + Send + Sync + 'static>(
        &self,
        lease: &Lease,
        error: E,
    ) -> RunError<E> {
        let mut class = (self.config.classifier)(&error);
        let mut message = error.to_string();
        let max = self.config.max_attempts.get();
        if class == FailureClass::Retryable && lease.attempt >= max {
            class = FailureClass::Terminal;
            message = format!("attempts exhausted ({} of {max}): {message}", lease.attempt);
        }
        m::count(m::EXECUTIONS, &[("result", class.as_str())]);
        self.record_failure(lease, Failure::new(class, message))
            .await;
        RunError::Handler {
            error,
            class,
            attempt: lease.attempt,
            retry_after: (class == FailureClass::Retryable)
                .then(|| self.config.backoff.delay(lease.attempt)),
        }
    }

    /// Records a failure; if the store refuses it (a message too large for
    /// it, say), records it again with the message cut short. If that
    /// cannot be done either, the lease simply runs out and a later
    /// attempt decides again.
    async fn record_failure(&self, lease: &Lease, failure: Failure) {
        let retention = self.config.failure_retention;
        let fail = |failure: Failure| async move {
            let (recorded, _) = self
                .with_store_retries(
                    lease,
                    || self.store.fail(lease, failure.clone(), retention),
                    m::OP_FAIL,
                )
                .await;
            recorded
        };
        let short = Failure::new(failure.class, cut_short(&failure.message));
        let was_cut = short.message != failure.message;
        let recorded = match fail(failure).await {
            Err(StoreError::Backend(_) | StoreError::Corrupt { .. }) if was_cut => {
                fail(short).await
            }
            other => other,
        };
        if let Err(error) = recorded {
            if matches!(error, StoreError::LeaseLost) {
                m::count(m::LEASE_LOST, &[("at", "fail")]);
            }
            tracing::warn!(%error, "could not record the failure");
        }
    }

    /// Retries a write a few times while the store is unavailable and the
    /// lease may still be held, so a blip does not turn a finished run into
    /// a re-run. Also says whether any try ended unavailable (and so may
    /// have been applied without an answer).
    async fn with_store_retries<Fut>(
        &self,
        lease: &Lease,
        mut op: impl FnMut() -> Fut,
        label: &'static str,
    ) -> (Result<(), StoreError>, bool)
    where
        Fut: Future<Output = Result<(), StoreError>>,
    {
        let mut delay = Duration::from_millis(20);
        let give_up = deadline(Instant::now(), self.config.lease);
        let mut uncertain = false;
        loop {
            match m::timed(label, op()).await {
                Err(StoreError::Unavailable(error))
                    if deadline(Instant::now(), delay) < give_up =>
                {
                    uncertain = true;
                    tracing::warn!(%error, attempt = lease.attempt, "store unavailable while recording the outcome; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.config.lease / 4);
                }
                other => return (other, uncertain),
            }
        }
    }

    /// Whether the record already holds `sealed` as its completed response
    /// (read with a claim, which answers with the stored outcome). A claim
    /// that acquires instead is given straight back.
    async fn stored_already(&self, lease: &Lease, params: &ClaimParams, sealed: &[u8]) -> bool {
        match self.store.claim(&lease.id, params).await {
            Ok(ClaimOutcome::Completed(stored)) => stored == sealed,
            Ok(ClaimOutcome::Acquired(other)) => {
                let _ = self.store.release(&other).await;
                false
            }
            _ => false,
        }
    }

    fn decode<T: DeserializeOwned, E>(&self, stored: &[u8]) -> Result<T, RunError<E>> {
        let bytes = codec::open(stored, self.config.max_response_bytes)
            .map_err(|reason| RunError::Decode { reason })?;
        self.codec.decode(&bytes).map_err(|e| RunError::Decode {
            reason: e.to_string(),
        })
    }
}

fn outcome_label<T, E>(result: &Result<Outcome<T>, RunError<E>>) -> &'static str {
    match result {
        Ok(Outcome::Executed { .. }) => "executed",
        Ok(Outcome::Replayed { .. }) => "replayed",
        Ok(Outcome::Unguarded { .. }) => "unguarded",
        Err(RunError::InProgress { .. }) => "in_progress",
        Err(RunError::Mismatch) => "mismatch",
        Err(RunError::Handler { .. }) => "handler_failed",
        Err(RunError::Failed(_)) => "replayed_failure",
        Err(RunError::ResponseTooLarge { .. }) => "response_too_large",
        Err(RunError::Parked(_)) => "parked",
        Err(RunError::Encode(_)) => "encode_error",
        Err(RunError::Decode { .. }) => "decode_error",
        Err(RunError::LeaseLost) => "lease_lost",
        Err(RunError::Store(_)) => "store_error",
        Err(RunError::Input { .. }) => "input_error",
    }
}

/// A claim made ahead of its run by [`Idempotency::claim_ahead`]: run it
/// with [`Idempotency::run_claimed`].
#[derive(Debug)]
pub struct ClaimedAhead {
    id: RecordId,
    params: ClaimParams,
    claim: Result<ClaimOutcome, StoreError>,
    sent: Instant,
}

impl ClaimedAhead {
    /// The record it claimed.
    pub fn id(&self) -> &RecordId {
        &self.id
    }
}

impl<S: ClaimMany, C: Codec> Idempotency<S, C> {
    /// Claims every run in one round trip (the store's `claim_many`), for
    /// runs that follow one another soon, such as the next records of a
    /// partition. Each answer is kept for [`run_claimed`](Self::run_claimed),
    /// which runs, replays or refuses exactly as [`run`](Self::run) would
    /// have. A claim older than a heartbeat interval is renewed before its
    /// handler starts; one that another worker took over meanwhile (its
    /// lease ran out first) is [`RunError::LeaseLost`] and its handler
    /// does not run. When the whole batch fails, every entry carries the
    /// error.
    pub async fn claim_ahead(
        &self,
        runs: Vec<(RecordId, Option<Fingerprint>)>,
    ) -> Vec<ClaimedAhead> {
        let claims: Vec<(RecordId, ClaimParams)> = runs
            .into_iter()
            .map(|(id, fingerprint)| (id, self.claim_params(fingerprint)))
            .collect();
        let sent = Instant::now();
        let mut answers = match m::timed(m::OP_CLAIM, self.store.claim_many(&claims)).await {
            Ok(answers) if answers.len() == claims.len() => answers,
            Ok(answers) => {
                let error = StoreError::Backend(
                    format!(
                        "claim_many answered {} claims of {}",
                        answers.len(),
                        claims.len()
                    )
                    .into(),
                );
                claims.iter().map(|_| Err(copy_error(&error))).collect()
            }
            Err(error) => claims.iter().map(|_| Err(copy_error(&error))).collect(),
        };
        claims
            .into_iter()
            .zip(answers.drain(..))
            .map(|((id, params), claim)| {
                if let Ok(outcome) = &claim {
                    m::count(m::CLAIMS, &[("outcome", outcome.label())]);
                }
                ClaimedAhead {
                    id,
                    params,
                    claim,
                    sent,
                }
            })
            .collect()
    }
}

impl<S: Store, C: Codec> Idempotency<S, C> {
    /// [`run`](Self::run) for a claim made ahead by
    /// [`claim_ahead`](Self::claim_ahead): runs `handler` if the claim was
    /// acquired, and otherwise answers as `run` would (a replay, a stored
    /// failure, in progress, a mismatch, or the store's error; fail-open
    /// runs unguarded). It does not wait for an in-flight duplicate.
    pub async fn run_claimed<T, E, F, Fut>(
        &self,
        ahead: ClaimedAhead,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let ClaimedAhead {
            id,
            params,
            claim,
            sent,
        } = ahead;
        self.instrumented(&id, async {
            match claim {
                Ok(ClaimOutcome::Acquired(lease)) => {
                    // A claim made a while ago is renewed before the
                    // handler starts: the renewal proves nobody took it
                    // over meanwhile, however long it waited.
                    let sent = if sent.elapsed() >= self.config.heartbeat {
                        let renewed = Instant::now();
                        match m::timed(m::OP_EXTEND, self.store.extend(&lease, params.lease)).await
                        {
                            Ok(_) => renewed,
                            Err(StoreError::LeaseLost) => {
                                m::count(m::LEASE_LOST, &[("at", "start")]);
                                return Err(RunError::LeaseLost);
                            }
                            Err(error) => return Err(RunError::Store(error)),
                        }
                    } else {
                        sent
                    };
                    self.execute(&lease, sent, &params, handler).await
                }
                Ok(outcome) => self.answer(outcome),
                Err(error @ StoreError::Unavailable(_)) if self.config.fail_open => {
                    tracing::warn!(%error, "store unreachable; running unguarded (fail-open)");
                    m::count(m::FAIL_OPEN, &[]);
                    self.unguarded(&id, handler).await
                }
                Err(error) => Err(RunError::Store(error)),
            }
        })
        .await
    }
}

/// The same error for another entry of a failed batch: same kind, the
/// first one's text.
fn copy_error(error: &StoreError) -> StoreError {
    match error {
        StoreError::LeaseLost => StoreError::LeaseLost,
        StoreError::Unavailable(e) => StoreError::Unavailable(e.to_string().into()),
        StoreError::CapacityExceeded { capacity } => StoreError::CapacityExceeded {
            capacity: *capacity,
        },
        StoreError::Corrupt { id, reason } => StoreError::Corrupt {
            id: id.clone(),
            reason: reason.clone(),
        },
        StoreError::Backend(e) => StoreError::Backend(e.to_string().into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters_within_bounds() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..100 {
            let d1 = b.delay(1);
            assert!(
                d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100),
                "{d1:?}"
            );
            let d3 = b.delay(3);
            assert!(
                d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400),
                "{d3:?}"
            );
            let big = b.delay(u32::MAX);
            assert!(
                big >= Duration::from_millis(500) && big <= Duration::from_secs(1),
                "{big:?}"
            );
        }
    }

    #[test]
    fn classifier_finds_terminal_in_the_source_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] Terminal);
        assert_eq!(
            default_classifier(&Outer(Terminal::new("no"))),
            FailureClass::Terminal
        );
        assert_eq!(
            default_classifier(&std::io::Error::other("x")),
            FailureClass::Retryable
        );
        assert_eq!(
            default_classifier(&Terminal::wrap(std::io::Error::other("x"))),
            FailureClass::Terminal
        );
    }

    #[test]
    fn refuses_bad_configuration() {
        let store = crate::MemoryStore::new();
        let err = |b: IdempotencyBuilder<crate::MemoryStore>| b.build().err();
        assert_eq!(
            err(Idempotency::builder(store.clone()).lease(Duration::ZERO)),
            Some(ConfigError::ZeroLease)
        );
        assert!(matches!(
            err(Idempotency::builder(store.clone()).heartbeat(Duration::from_secs(30))),
            Some(ConfigError::HeartbeatTooSlow { .. })
        ));
        assert!(matches!(
            err(Idempotency::builder(store).retention(Duration::from_secs(1))),
            Some(ConfigError::RetentionShorterThanLease { .. })
        ));
    }
}
