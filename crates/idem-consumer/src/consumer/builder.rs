//! How a [`Consumer`] is set up.

use std::sync::Arc;
use std::time::Duration;

use idem::{ClaimMany, Codec, Idempotency, Json, Scope, Store};

use crate::ahead::ClaimAhead;
use crate::key::KeyExtractor;
use crate::reconcile::{Reconciler, Reconciling};

use super::{Consumer, Counters, Inner};

impl<S: Store> Consumer<S, Json> {
    /// A consumer whose records live under `scope`.
    pub fn builder<C: Codec>(idem: Idempotency<S, C>, scope: Scope) -> ConsumerBuilder<S, C> {
        ConsumerBuilder {
            idem,
            scope,
            keys: KeyExtractor::header("Idempotency-Key").or(crate::KeySource::MessageId),
            fingerprint: true,
            name: None,
            min_retry: Duration::from_millis(100),
            max_retry: Duration::from_secs(300),
            ahead: None,
            reconciling: None,
            reconcile_limits: None,
        }
    }
}

/// Builds a [`Consumer`].
pub struct ConsumerBuilder<S, C = Json> {
    idem: Idempotency<S, C>,
    scope: Scope,
    keys: KeyExtractor,
    fingerprint: bool,
    name: Option<String>,
    min_retry: Duration,
    max_retry: Duration,
    ahead: Option<ClaimAhead<S, C>>,
    reconciling: Option<Reconciling>,
    reconcile_limits: Option<(Duration, usize)>,
}

impl<S, C> std::fmt::Debug for ConsumerBuilder<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("idem", &self.idem)
            .field("scope", &self.scope)
            .field("name", &self.name)
            .field("fingerprint", &self.fingerprint)
            .field("claims_ahead", &self.ahead.is_some())
            .field("reconciles", &self.reconciling.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Store, C: Codec> ConsumerBuilder<S, C> {
    /// Where keys come from (default: the `Idempotency-Key` header, then
    /// the broker's message id; dead-letter when neither is present).
    #[must_use]
    pub fn keys(mut self, keys: KeyExtractor) -> Self {
        self.keys = keys;
        self
    }

    /// Whether a key reused with a different payload is refused and
    /// dead-lettered (default: yes). The payload is compared by the hash
    /// of its canonical JSON, or of its bytes when it is not JSON.
    #[must_use]
    pub fn fingerprint(mut self, on: bool) -> Self {
        self.fingerprint = on;
        self
    }

    /// The name in metrics and logs (default: the scope).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Bounds on the delay before a retried delivery (default 100 ms to
    /// 5 minutes): the backoff or the other claim's remaining lease,
    /// clamped to these.
    #[must_use]
    pub fn retry_delay(mut self, min: Duration, max: Duration) -> Self {
        self.min_retry = min;
        self.max_retry = max.max(min);
        self
    }

    /// Asks `reconciler` whether a step in doubt took effect when a
    /// delivery finds its key parked, instead of dead-lettering it for a
    /// person (see [`crate::reconcile`]); [`Consumer::sweep_parked`] asks
    /// about parked keys on a schedule. Off by default; the store must
    /// keep a step journal (every store idem ships does).
    #[must_use]
    pub fn reconciler(mut self, reconciler: impl Reconciler) -> Self {
        self.reconciling = Some(Reconciling::new(Arc::new(reconciler)));
        self
    }

    /// How long the reconciler may take (default
    /// [`DEFAULT_RECONCILE_TIMEOUT`](crate::reconcile::DEFAULT_RECONCILE_TIMEOUT))
    /// and how many reconciliations may run at once (default
    /// [`DEFAULT_MAX_RECONCILING`](crate::reconcile::DEFAULT_MAX_RECONCILING)).
    /// No effect without a [`reconciler`](Self::reconciler), given before
    /// or after. Keep the timeout well within the broker's visibility
    /// timeout: the message is not kept alive while the reconciler is
    /// asked.
    #[must_use]
    pub fn reconcile_limits(mut self, timeout: Duration, at_once: usize) -> Self {
        self.reconcile_limits = Some((timeout, at_once.max(1)));
        self
    }

    /// The consumer.
    pub fn build(self) -> Consumer<S, C> {
        let name: Arc<str> = self
            .name
            .unwrap_or_else(|| self.scope.as_str().to_owned())
            .into();
        Consumer {
            inner: Arc::new(Inner {
                idem: self.idem,
                scope: self.scope,
                keys: self.keys,
                fingerprint: self.fingerprint,
                name,
                min_retry: self.min_retry,
                max_retry: self.max_retry,
                ahead: self.ahead,
                reconciling: self.reconciling.map(|mut reconciling| {
                    if let Some((timeout, at_once)) = self.reconcile_limits {
                        reconciling.timeout = timeout;
                        reconciling.slots = Arc::new(tokio::sync::Semaphore::new(at_once));
                    }
                    reconciling
                }),
                counters: Counters::default(),
            }),
        }
    }
}

impl<S: ClaimMany, C: Codec> ConsumerBuilder<S, C> {
    /// Claims the deliveries that are waiting together in one round trip
    /// (the store's `claim_many`) instead of one claim each: when
    /// [`Consumer::run`](crate::Consumer::run) takes a delivery it also
    /// takes every further one the broker has already sent, up to the
    /// free places in its window, claims them together and starts their
    /// handlers at once. Each is then run, replayed, retried or
    /// dead-lettered exactly as alone; a key delivered twice in one
    /// window is claimed twice in order, so the second finds the first in
    /// progress (off by default).
    #[must_use]
    pub fn claim_ahead(mut self) -> Self {
        self.ahead = Some(crate::ahead::claim_many::<S, C>);
        self
    }
}
