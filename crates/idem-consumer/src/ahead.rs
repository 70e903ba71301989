//! Claims for the deliveries that arrive together, in one round trip
//! (the store's [`ClaimMany`]): what [`ConsumerBuilder::claim_ahead`]
//! turns on for [`Consumer::run`](crate::Consumer::run).

use futures_util::future::BoxFuture;
use idem::{ClaimMany, ClaimedAhead, Codec, Fingerprint, Idempotency, RecordId};

use crate::consumer::ConsumerBuilder;

/// How a consumer claims a window's deliveries together: the executor's
/// [`Idempotency::claim_ahead`] for a store with [`ClaimMany`], kept as a
/// function so that consumers of stores without it need nothing more.
pub(crate) type ClaimAhead<S, C> = for<'a> fn(
    &'a Idempotency<S, C>,
    Vec<(RecordId, Option<Fingerprint>)>,
) -> BoxFuture<'a, Vec<ClaimedAhead>>;

fn claim_many<S: ClaimMany, C: Codec>(
    idem: &Idempotency<S, C>,
    runs: Vec<(RecordId, Option<Fingerprint>)>,
) -> BoxFuture<'_, Vec<ClaimedAhead>> {
    Box::pin(idem.claim_ahead(runs))
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
        self.ahead = Some(claim_many::<S, C>);
        self
    }
}
