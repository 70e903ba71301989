//! The layer and its builder: what is covered, how keys, scopes and
//! fingerprints are made, what is stored, and for how long.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use idem::blob::Blobs;
use idem::codec::Keyring;
use idem::derive::json::JsonKey;
use idem::key_hash::KeyHasher;
use idem::outbox::Sender;
use idem::{ConfigError, FailureClass, Idempotency, KeyRules, Store};
use tokio_util::task::TaskTracker;
use tower_layer::Layer;

mod keys;

use crate::grpc;
use crate::keep::{KeepRules, ReplayPolicy};
use crate::reconcile::Reconciling;
use crate::request::{Settings, Unstored};
use crate::rules::{default_stored, FingerprintRule, Hook};
use crate::service::IdempotencyService;
use crate::stored::Responses;
use crate::webhook::Webhook;

/// Configures an [`IdempotencyLayer`]; [`IdempotencyLayer::builder`] has
/// the defaults.
pub struct IdempotencyLayerBuilder<S> {
    store: S,
    methods: Vec<Method>,
    header: HeaderName,
    required: bool,
    key_rules: KeyRules,
    tenant: Option<Hook<Option<String>>>,
    route: Option<Hook<String>>,
    fingerprint: FingerprintRule,
    stored: Arc<dyn Fn(StatusCode) -> bool + Send + Sync>,
    max_request_bytes: usize,
    max_response_bytes: usize,
    retention: Duration,
    lease: Duration,
    fail_open: bool,
    forward_takeovers: bool,
    reject_old_uuid_v7: bool,
    max_wait: Duration,
    default_wait: Duration,
    replay_cache_bytes: usize,
    replay_cache_ttl: Duration,
    replay_drop: Vec<HeaderName>,
    keep: KeepRules,
    keyring: Option<Keyring>,
    blobs: Option<Blobs>,
    outbox: Option<Arc<dyn Sender>>,
    key_hasher: Option<KeyHasher>,
    replay_set_cookie: bool,
    replay_redate: bool,
    grpc_request_id: grpc::RequestIdFields,
    body_key: Option<JsonKey>,
    webhook: Option<Webhook>,
    mcp: Option<String>,
    pub(crate) reconciling: Option<Reconciling>,
}

impl<S> std::fmt::Debug for IdempotencyLayerBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("store", &std::any::type_name::<S>())
            .field("methods", &self.methods)
            .field("header", &self.header)
            .field("required", &self.required)
            .field("retention", &self.retention)
            .field("lease", &self.lease)
            .field("fail_open", &self.fail_open)
            .finish_non_exhaustive()
    }
}

impl<S: Store> IdempotencyLayerBuilder<S> {
    /// The methods covered (default POST and PATCH); others pass through
    /// untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The key header (default `Idempotency-Key`).
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// Whether a covered request without a key is refused with 400
    /// (`true`) or passed through unguarded (`false`, the default).
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// The key rules (default: 1..=255 bytes of visible ASCII).
    pub fn key_rules(mut self, rules: KeyRules) -> Self {
        self.key_rules = rules;
        self
    }

    /// A tenant discriminator taken from the request head: requests of two
    /// tenants never share a record, so no client can replay another's
    /// response. The value is hashed into the scope, so it may be a secret.
    /// `None` puts the request in an "anonymous" tenant.
    ///
    /// Take it from something that stays the same between a request and
    /// its retries: the verified principal (account or API-key id, see
    /// [`tenant_principal`](Self::tenant_principal)), not a bearer token. A
    /// token refreshed between a request and its retry would put the retry
    /// in another scope, where it runs again.
    pub fn tenant(
        mut self,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.tenant = Some(Arc::new(tenant));
        self
    }

    /// The tenant is the principal your authentication layer verified and
    /// put in the request's extensions as a `P` (placed outside this
    /// layer), mapped to a stable id by `id`: an account or API-key id
    /// survives token refreshes, so a retry always lands in its request's
    /// scope. Requests without a `P` share the "anonymous" tenant.
    ///
    /// ```
    /// # fn demo(store: idem::MemoryStore) -> Result<(), idem::ConfigError> {
    /// #[derive(Clone)]
    /// struct Account { id: u64 }
    ///
    /// let layer = idem_http::IdempotencyLayer::builder(store)
    ///     .tenant_principal(|account: &Account| account.id.to_string())
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn tenant_principal<P: Send + Sync + 'static>(
        self,
        id: impl Fn(&P) -> String + Send + Sync + 'static,
    ) -> Self {
        self.tenant(move |parts| parts.extensions.get::<P>().map(&id))
    }

    /// The tenant is the value of `header` (all of its values, in order).
    /// Use a header that identifies the caller stably (an API key id set
    /// by your auth proxy), not one that changes on refresh such as a
    /// bearer token in `Authorization`: see [`tenant`](Self::tenant).
    pub fn tenant_header(self, header: HeaderName) -> Self {
        self.tenant(move |parts| {
            let values: Vec<&[u8]> = parts
                .headers
                .get_all(&header)
                .iter()
                .map(HeaderValue::as_bytes)
                .collect();
            (!values.is_empty()).then(|| hex::encode(values.join(&b'\n')))
        })
    }

    /// The route part of the scope (default: axum's matched route template
    /// when the `axum` feature is on and one is present, else the path).
    pub fn route(mut self, route: impl Fn(&Parts) -> String + Send + Sync + 'static) -> Self {
        self.route = Some(Arc::new(route));
        self
    }

    /// What the fingerprint covers (default [`FingerprintRule::Request`]).
    pub fn fingerprint(mut self, rule: FingerprintRule) -> Self {
        self.fingerprint = rule;
        self
    }

    /// Which response statuses are stored and replayed (default
    /// [`default_stored`]); the others release the key.
    pub fn store_status(
        mut self,
        stored: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.stored = Arc::new(stored);
        self
    }

    /// The largest request body accepted on covered methods (default
    /// 1 MiB); larger ones get 413 and the key is not used.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger one is
    /// still sent to the client that caused it, but the key is then closed
    /// for good: later requests under it get 422.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// How long a completed key is remembered (default 24 h); advertised
    /// on every covered response in `Idempotency-Key-Lifetime`.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long a claim lasts without a heartbeat (default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// When the store cannot be reached: refuse with 503 (`false`, the
    /// default) or pass the request through unguarded (`true`).
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// What to do with a request whose key's earlier attempt stopped
    /// without an outcome (its lease ran out: the process serving it died
    /// mid-request). That attempt may have reached the inner service, so
    /// by default (`false`) the key is recorded as failed with an unknown
    /// outcome and answered 422 `outcome-unknown` until an operator checks
    /// and releases it (`idem release`). `true` passes the request on
    /// again, for services that deduplicate on the `Idempotency-Key` they
    /// receive; the handler sees [`Context::is_takeover`](idem::Context::is_takeover).
    pub fn forward_takeovers(mut self, forward: bool) -> Self {
        self.forward_takeovers = forward;
        self
    }

    /// The longest a duplicate of a running request is held for its
    /// outcome when it asks with `Prefer: wait=N` (RFC 7240; default 10 s).
    /// It gets the stored response as soon as it is there (woken by the
    /// store's notification where it has one), or 409 when the wait ends;
    /// `Preference-Applied: wait=N` says how long it was allowed. Zero
    /// ignores the preference.
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.max_wait = max;
        self
    }

    /// How long a duplicate of a running request waits for its outcome
    /// when it does not say (no `Prefer: wait`); default zero: 409 at once.
    /// Capped by [`max_wait`](Self::max_wait).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// Refuse keys that are UUIDv7s minted longer ago than the retention
    /// (default `false`). Such a key may be a late retry of a request whose
    /// record has already expired, which cannot be told from a new request,
    /// so it is answered 410 `key-too-old` instead of run. Keys that are
    /// not UUIDv7s are not affected; the age is read from the key's own
    /// timestamp against this machine's clock, with 5 s of slack for keys
    /// from the future.
    pub fn reject_old_uuid_v7(mut self, reject: bool) -> Self {
        self.reject_old_uuid_v7 = reject;
        self
    }

    /// Memory for replays of responses this layer stored (default 64 MiB;
    /// `0` turns it off): a retry of such a request is answered from
    /// memory, without a round trip to the store. See
    /// [`idem::IdempotencyBuilder::replay_cache_bytes`].
    pub fn replay_cache_bytes(mut self, bytes: usize) -> Self {
        self.replay_cache_bytes = bytes;
        self
    }

    /// The longest a stored response is replayed from memory (default
    /// 60 s, never past the retention): also how long a record deleted
    /// outside this process may still be replayed here. See
    /// [`idem::IdempotencyBuilder::replay_cache_ttl`].
    pub fn replay_cache_ttl(mut self, ttl: Duration) -> Self {
        self.replay_cache_ttl = ttl;
        self
    }

    /// Stored response headers left out of replays (default: none besides
    /// `set-cookie`, see [`replay_set_cookie`](Self::replay_set_cookie)).
    /// The stored response keeps them: changing this list changes the
    /// replays of stored records too.
    pub fn replay_drop_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.replay_drop = names.into_iter().collect();
        self
    }

    /// Whether replays carry the stored `Set-Cookie` headers (default
    /// `false`): a session cookie given to the first answer would be
    /// handed to anyone who sends the same key and body again. The first
    /// answer always carries them.
    pub fn replay_set_cookie(mut self, replay: bool) -> Self {
        self.replay_set_cookie = replay;
        self
    }

    /// Whether a replay carries a `Date` of its own time (`true`, the
    /// default), as any fresh answer does, or the stored response's
    /// (`false`). Caches and clients read `Date` as when the answer was
    /// made; `Age`-style reasoning about the original is left to the
    /// `Idempotent-Replayed` header.
    pub fn replay_redate(mut self, redate: bool) -> Self {
        self.replay_redate = redate;
        self
    }

    /// What is stored of every response for its replays (default
    /// [`ReplayPolicy::Full`]); paths given their own policy with
    /// [`keep_for`](Self::keep_for) keep theirs. The client whose request
    /// ran always gets the whole response; a replay of a response stored
    /// reduced says what was kept in `Idempotent-Replay-Kept`.
    pub fn keep(mut self, policy: ReplayPolicy) -> Self {
        self.keep.set_default(policy);
        self
    }

    /// What is stored for replays of requests whose path is `prefix` or
    /// below it (whole segments: `/v1/tokens` covers `/v1/tokens/7`); the
    /// longest matching prefix wins.
    pub fn keep_for(mut self, prefix: &str, policy: ReplayPolicy) -> Self {
        self.keep.set(prefix, policy);
        self
    }

    /// Seals stored responses with `keyring` (see
    /// [`idem::IdempotencyBuilder::keyring`]): a dump of the store shows
    /// no response. Default: stored as they are.
    pub fn keyring(mut self, keyring: Keyring) -> Self {
        self.keyring = Some(keyring);
        self
    }

    /// Stores records under a keyed hash of their scope and key (see
    /// [`idem::IdempotencyBuilder::hash_keys`]): a dump of the store shows
    /// no key a client sent. Default: keys stored as sent.
    pub fn hash_keys(mut self, hasher: KeyHasher) -> Self {
        self.key_hasher = Some(hasher);
        self
    }

    /// Where bodies of routes kept by [`ReplayPolicy::Reference`] go
    /// (needed by that policy): a [`DirBlobs`](idem::blob::DirBlobs)
    /// beside the embedded store, or a blob store of another crate. Blobs
    /// are not sealed, so this cannot be combined with a
    /// [`keyring`](Self::keyring).
    pub fn blobs(mut self, blobs: Blobs) -> Self {
        self.blobs = Some(blobs);
        self
    }

    /// Gives handlers behind the layer an outbox: messages they send with
    /// [`Context::send`](idem::Context::send) (the run's context is a
    /// request extension) are stored with the response and sent through
    /// `sender` once it is stored; a retry is answered from the record and
    /// sends nothing again. See [`idem::outbox`].
    pub fn outbox(mut self, sender: impl Sender) -> Self {
        self.outbox = Some(Arc::new(sender));
        self
    }

    /// Every policy at once (the gateway's `--keep`).
    pub fn keep_rules(mut self, rules: KeepRules) -> Self {
        self.keep = rules;
        self
    }

    /// Checks the configuration and builds the layer.
    pub fn build(mut self) -> Result<IdempotencyLayer<S>, ConfigError> {
        if let Some(argument) = &self.mcp {
            if self.keep.any_reference() {
                return Err(ConfigError::RewrittenByReference);
            }
            self.body_key = Some(JsonKey::Pointer(crate::mcp::key_pointer(argument)));
            self.fingerprint = FingerprintRule::JsonFields(crate::mcp::fingerprint_fields());
        }
        if let Some(source) = &self.body_key {
            source.check()?;
        }
        if self.reconciling.is_some() && self.store.step_journal().is_none() {
            return Err(ConfigError::ReconcilerWithoutJournal);
        }
        // Room for the head around the largest body.
        let max_stored_bytes = self.max_response_bytes.saturating_add(64 * 1024);
        if self.keep.any_reference() {
            if self.blobs.is_none() {
                return Err(ConfigError::NoBlobStore);
            }
            if self.keyring.is_some() {
                return Err(ConfigError::BlobsNotSealed);
            }
        }
        let mut idem = Idempotency::builder(self.store).codec(Responses);
        if let Some(keyring) = self.keyring {
            idem = idem.keyring(keyring);
        }
        if let Some(hasher) = self.key_hasher {
            idem = idem.hash_keys(hasher);
        }
        if let Some(sender) = self.outbox {
            idem = idem.outbox(sender);
        }
        let idem = idem
            .lease(self.lease)
            .retention(self.retention)
            .fail_open(self.fail_open)
            // The client decides whether to retry a 5xx, however often.
            .max_attempts(NonZeroU32::MAX)
            .max_response_bytes(max_stored_bytes)
            .replay_cache_bytes(self.replay_cache_bytes)
            .replay_cache_ttl(self.replay_cache_ttl)
            .classify(|error| {
                error
                    .downcast_ref::<Unstored>()
                    .map_or(FailureClass::Retryable, Unstored::class)
            })
            .build()?;
        let mut replay_drop = self.replay_drop;
        if !self.replay_set_cookie && !replay_drop.contains(&http::header::SET_COOKIE) {
            replay_drop.push(http::header::SET_COOKIE);
        }
        Ok(IdempotencyLayer {
            settings: Arc::new(Settings {
                idem,
                methods: self.methods,
                header: self.header,
                required: self.required,
                key_rules: self.key_rules,
                tenant: self.tenant,
                route: self.route,
                fingerprint: self.fingerprint,
                stored: self.stored,
                max_request_bytes: self.max_request_bytes,
                max_response_bytes: self.max_response_bytes,
                max_stored_bytes,
                retention: self.retention,
                lifetime: HeaderValue::from(self.retention.as_secs()),
                forward_takeovers: self.forward_takeovers,
                reject_old_uuid_v7: self.reject_old_uuid_v7,
                max_wait: self.max_wait,
                default_wait: self.default_wait.min(self.max_wait),
                replay_drop,
                keep: self.keep,
                blobs: self.blobs,
                replay_redate: self.replay_redate,
                grpc_request_id: self.grpc_request_id,
                body_key: self.body_key,
                webhook: self.webhook,
                mcp: self.mcp.is_some(),
                reconciling: self.reconciling,
                runs: TaskTracker::new(),
            }),
        })
    }
}

/// A tower [`Layer`] giving covered requests `Idempotency-Key` semantics
/// (docs/design.md §8): one execution per key, stored responses replayed byte for
/// byte, problem+json answers for everything else.
///
/// The work of a covered request (calling the inner service, reading and
/// storing its response, the lease's heartbeat) runs as a task of its own,
/// detached from the client's connection: a client that disconnects or
/// times out does not cut it off, and its retry gets 409 while it runs and
/// the stored response after. Call [`drain`](Self::drain) at shutdown so
/// the process waits for such runs.
pub struct IdempotencyLayer<S> {
    pub(crate) settings: Arc<Settings<S>>,
}

impl<S> Clone for IdempotencyLayer<S> {
    fn clone(&self) -> Self {
        Self {
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<S> std::fmt::Debug for IdempotencyLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("running", &self.running())
            .finish_non_exhaustive()
    }
}

impl<S> IdempotencyLayer<S> {
    /// How many covered requests are running now (their clients may have
    /// gone).
    pub fn running(&self) -> usize {
        self.settings.runs.len()
    }

    /// Waits until no covered request is running: each has stored its
    /// response or released its key. Call it after the server stopped
    /// accepting requests (after axum's graceful shutdown returns), so that
    /// work whose client disconnected still finishes before the process
    /// exits.
    pub async fn drain(&self) {
        let runs = &self.settings.runs;
        runs.close();
        runs.wait().await;
        runs.reopen();
    }
}

/// The largest request body on covered methods, unless set: 1 MiB, the
/// layer's and the gateway's default.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
/// The longest a request may ask (`Prefer: wait=N`) to wait for a running
/// duplicate's outcome, unless set: the layer's and the gateway's default.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

impl<S: Store> IdempotencyLayer<S> {
    /// Drops the replay this layer keeps in memory of the record stored as
    /// `stored` (its key hashed, if the layer hashes keys; see
    /// [`replay_cache_bytes`](IdempotencyLayerBuilder::replay_cache_bytes)):
    /// call it when an operator deleted or released that record, so the
    /// key's next request reaches the store at once.
    pub fn forget_stored(&self, stored: &idem::RecordId) {
        self.settings.idem.forget_stored(stored);
    }

    /// Starts configuring a layer over `store`. Defaults: POST and PATCH
    /// covered, `Idempotency-Key` optional, fingerprint of method, path,
    /// query and body, 2xx and most 4xx stored, 1 MiB request and response
    /// limits, 24 h retention, 30 s leases, fail-closed, takeovers answered
    /// as outcome unknown, retries of responses stored here replayed from
    /// memory for up to 60 s.
    pub fn builder(store: S) -> IdempotencyLayerBuilder<S> {
        IdempotencyLayerBuilder {
            store,
            methods: vec![Method::POST, Method::PATCH],
            header: HeaderName::from_static("idempotency-key"),
            required: false,
            key_rules: KeyRules::default(),
            tenant: None,
            route: None,
            fingerprint: FingerprintRule::Request,
            stored: Arc::new(default_stored),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_response_bytes: idem::DEFAULT_MAX_RESPONSE_BYTES,
            retention: idem::DEFAULT_RETENTION,
            lease: idem::DEFAULT_LEASE,
            fail_open: false,
            forward_takeovers: false,
            reject_old_uuid_v7: false,
            max_wait: DEFAULT_MAX_WAIT,
            default_wait: Duration::ZERO,
            replay_cache_bytes: idem::DEFAULT_REPLAY_CACHE_BYTES,
            replay_cache_ttl: idem::DEFAULT_REPLAY_CACHE_TTL,
            replay_drop: Vec::new(),
            keep: KeepRules::default(),
            keyring: None,
            blobs: None,
            outbox: None,
            key_hasher: None,
            replay_set_cookie: false,
            replay_redate: true,
            grpc_request_id: grpc::RequestIdFields::default(),
            body_key: None,
            webhook: None,
            mcp: None,
            reconciling: None,
        }
    }
}

impl<S, I> Layer<I> for IdempotencyLayer<S> {
    type Service = IdempotencyService<S, I>;

    fn layer(&self, inner: I) -> Self::Service {
        IdempotencyService::new(Arc::clone(&self.settings), inner)
    }
}
