//! Configuring an executor: [`IdempotencyBuilder`] and what it refuses.

use std::error::Error as StdError;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::replays::{Replays, DEFAULT_REPLAY_CACHE_BYTES, DEFAULT_REPLAY_CACHE_TTL};
use super::{default_classifier, Backoff, Classifier, Config, Idempotency};
use crate::codec::{AtRest, Codec, Json, Keyring};
use crate::key_hash::KeyHasher;
use crate::outbox::{OutboxConfig, Sender, SentBy};
use crate::record::FailureClass;
use crate::store::Store;

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
    /// A reconciler settles keys through the step journal; the store keeps
    /// none.
    #[error("a reconciler needs a store with a step journal; this store keeps none")]
    ReconcilerWithoutJournal,
    /// A keyring was given for a store that re-encodes what it is handed
    /// (the remote store): configure encryption where the records are
    /// stored (`idem serve --keyring`).
    #[error(
        "this store re-encodes stored responses, so the executor cannot seal them; configure \
         the keyring where the records are stored"
    )]
    SealingUnsupported,
    /// An outbox was given for a store that re-encodes stored responses
    /// (the claim API's remote store): the messages would not survive it.
    #[error(
        "this store re-encodes stored responses, so the executor cannot keep a run's messages \
         in them; send through the outbox where the records are stored"
    )]
    OutboxUnsupported,
    /// [`outbox_sent_by_store`](IdempotencyBuilder::outbox_sent_by_store)
    /// for a store that does not take a run's messages.
    #[error(
        "this store does not take the messages a run sends: give the executor a sender \
         (outbox) or a dispatcher elsewhere (outbox_sent_elsewhere)"
    )]
    StoreSendsNoMessages,
    /// A key source is unusable (a pointer not starting with `/`, a list
    /// naming no field).
    #[error(transparent)]
    KeySource(#[from] crate::derive::json::JsonKeyError),
    /// Responses are rewritten on replay (an MCP answer's JSON-RPC id), so
    /// their bodies cannot be kept by reference in a blob store.
    #[error(
        "replays of MCP tool calls are re-addressed to each retry's JSON-RPC id, so their \
         bodies cannot be kept by reference: keep them whole"
    )]
    RewrittenByReference,
    /// Responses are to be kept by reference, but no blob store was given.
    #[error("a replay policy keeps bodies by reference, but no blob store was given")]
    NoBlobStore,
    /// A keyring and a blob store together: blobs are not sealed, so the
    /// bodies kept in them would be stored in clear.
    #[error(
        "blobs are not sealed: with a keyring, keep responses in full, status-only or \
         redacted, not by reference"
    )]
    BlobsNotSealed,
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
    keyring: Option<Arc<Keyring>>,
    key_hasher: Option<KeyHasher>,
    max_response_bytes: usize,
    wait_for_in_flight: Option<Duration>,
    fail_open: bool,
    classifier: Classifier,
    log_keys: bool,
    replay_cache_bytes: usize,
    replay_cache_ttl: Duration,
    outbox: Option<SentBy>,
}

impl<S, C> std::fmt::Debug for IdempotencyBuilder<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyBuilder")
            .field("store", &std::any::type_name::<S>())
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat)
            .field("retention", &self.retention)
            .field("max_attempts", &self.max_attempts)
            .field("fail_open", &self.fail_open)
            .finish_non_exhaustive()
    }
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
    /// stores keep at most [`LONGEST_HELD`](crate::store::LONGEST_HELD), a
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
    /// [`RunError::ResponseTooLarge`](crate::RunError::ResponseTooLarge): the handler's effect happened, so it
    /// must not run again.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// When the key is in progress elsewhere, wait up to `max` for that
    /// outcome (notified by the store where it can) instead of returning
    /// [`RunError::InProgress`](crate::RunError::InProgress) at once.
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

    /// Seals every stored response and step result with `keyring`'s
    /// current key (XChaCha20-Poly1305, bound to its record), so a dump of
    /// the store shows none of them; its older keys still open what they
    /// sealed, and payloads stored before encryption was on stay readable.
    /// Default: stored as they are.
    pub fn keyring(mut self, keyring: Keyring) -> Self {
        self.keyring = Some(Arc::new(keyring));
        self
    }

    /// Stores each record under a keyed hash of its scope and key instead
    /// of the key (see [`KeyHasher`]): a dump of the store shows no key a
    /// client sent. Callers go on passing clear keys; tools that read the
    /// store directly find a record with
    /// [`Idempotency::stored_id`](crate::Idempotency::stored_id) (`idem
    /// inspect --key-secret`). Turning it on (or changing the secret)
    /// forgets the keys stored before: their retries run again. Default:
    /// keys stored as sent.
    pub fn hash_keys(mut self, hasher: KeyHasher) -> Self {
        self.key_hasher = Some(hasher);
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
            keyring: self.keyring,
            key_hasher: self.key_hasher,
            max_response_bytes: self.max_response_bytes,
            wait_for_in_flight: self.wait_for_in_flight,
            fail_open: self.fail_open,
            classifier: self.classifier,
            log_keys: self.log_keys,
            replay_cache_bytes: self.replay_cache_bytes,
            replay_cache_ttl: self.replay_cache_ttl,
            outbox: self.outbox,
        }
    }

    /// Gives handlers an outbox: messages they send with
    /// [`Context::send`](crate::Context::send) are stored with their run's
    /// completion and dispatched through `sender` once it is stored, and
    /// re-dispatched (never re-run) on a duplicate if they were not
    /// confirmed. See [`crate::outbox`]; run
    /// [`spawn_outbox_dispatcher`](Idempotency::spawn_outbox_dispatcher)
    /// beside it to send what a process that died left behind.
    pub fn outbox(mut self, sender: impl Sender) -> Self {
        self.outbox = Some(SentBy::Here(Arc::new(sender)));
        self
    }

    /// Gives handlers an outbox whose messages a dispatcher elsewhere
    /// sends: they are stored with their run's completion, as with
    /// [`outbox`](Self::outbox), and the run's marker is held, but this
    /// executor sends nothing. A dispatcher over the same store (`idem
    /// outbox run`, or another executor's
    /// [`spawn_outbox_dispatcher`](Idempotency::spawn_outbox_dispatcher))
    /// sends them once the marker's lease has run out: about a lease plus
    /// its interval after the run.
    pub fn outbox_sent_elsewhere(mut self) -> Self {
        self.outbox = Some(SentBy::Elsewhere);
        self
    }

    /// Gives handlers an outbox whose messages the store takes with the
    /// completion and sends on its side ([`Store::sends_messages`]; the
    /// remote store does: `idem serve` keeps them with the result and
    /// dispatches them). This executor holds no marker and sends nothing,
    /// not even on a replay: the server re-dispatches what is unconfirmed
    /// when it answers a duplicate.
    pub fn outbox_sent_by_store(mut self) -> Self {
        self.outbox = Some(SentBy::Store);
        self
    }

    /// How much memory replays of outcomes this executor stored may take
    /// ([`DEFAULT_REPLAY_CACHE_BYTES`], 64 MiB): a duplicate of such a run
    /// is answered from memory, without a round trip to the store. `0`
    /// turns the cache off. What it keeps and for how long:
    /// [`replay_cache_ttl`](Self::replay_cache_ttl).
    pub fn replay_cache_bytes(mut self, bytes: usize) -> Self {
        self.replay_cache_bytes = bytes;
        self
    }

    /// The longest a replay is served from memory
    /// ([`DEFAULT_REPLAY_CACHE_TTL`], 60 s), and never past the record's
    /// retention. Records deleted through
    /// [`Idempotency::delete`] or [`Idempotency::forget`] leave the cache
    /// at once; a delete made elsewhere (another process, the admin CLI)
    /// is seen once this has passed, so keep it short where operators
    /// delete records to let a key run again. Zero turns the cache off.
    pub fn replay_cache_ttl(mut self, ttl: Duration) -> Self {
        self.replay_cache_ttl = ttl;
        self
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
        if self.keyring.is_some() && !self.store.keeps_bytes() {
            return Err(ConfigError::SealingUnsupported);
        }
        match &self.outbox {
            Some(SentBy::Store) if !self.store.sends_messages() => {
                return Err(ConfigError::StoreSendsNoMessages);
            }
            Some(SentBy::Here(_) | SentBy::Elsewhere) if !self.store.keeps_bytes() => {
                return Err(ConfigError::OutboxUnsupported);
            }
            _ => {}
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
                at_rest: AtRest::new(self.compress_above, self.keyring),
                key_hasher: self.key_hasher,
                max_response_bytes: self.max_response_bytes,
                wait_for_in_flight: self.wait_for_in_flight,
                fail_open: self.fail_open,
                classifier: self.classifier,
                log_keys: self.log_keys,
                replays: Replays::new(self.replay_cache_bytes, self.replay_cache_ttl),
                outbox: self.outbox.map(OutboxConfig::new),
            }),
        })
    }
}

/// How long a claim is held without a heartbeat, unless set: the
/// executor's, the HTTP layer's and the gateway's default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// How long outcomes are kept, unless set: the executor's, the HTTP
/// layer's and the gateway's default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The largest response (encoded) stored, unless set: 1 MiB, the
/// executor's, the HTTP layer's and the gateway's default.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1 << 20;

impl<S: Store> Idempotency<S, Json> {
    /// Starts configuring an executor over `store`.
    pub fn builder(store: S) -> IdempotencyBuilder<S, Json> {
        IdempotencyBuilder {
            store,
            codec: Json,
            lease: DEFAULT_LEASE,
            heartbeat: None,
            retention: DEFAULT_RETENTION,
            failure_retention: None,
            max_attempts: NonZeroU32::new(5).expect("5 is not zero"),
            backoff: Backoff::default(),
            compress_above: 1024,
            keyring: None,
            key_hasher: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            wait_for_in_flight: None,
            fail_open: false,
            classifier: Arc::new(default_classifier),
            log_keys: false,
            replay_cache_bytes: DEFAULT_REPLAY_CACHE_BYTES,
            replay_cache_ttl: DEFAULT_REPLAY_CACHE_TTL,
            outbox: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
