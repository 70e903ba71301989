//! Claims for the deliveries that arrive together, in one round trip
//! (the store's [`ClaimMany`]): what
//! [`ConsumerBuilder::claim_ahead`](crate::ConsumerBuilder::claim_ahead)
//! turns on for [`Consumer::run`](crate::Consumer::run).

use futures_util::future::BoxFuture;
use idem::{ClaimMany, ClaimedAhead, Codec, Fingerprint, Idempotency, RecordId};

/// How a consumer claims a window's deliveries together: the executor's
/// [`Idempotency::claim_ahead`] for a store with [`ClaimMany`], kept as a
/// function so that consumers of stores without it need nothing more.
pub(crate) type ClaimAhead<S, C> = for<'a> fn(
    &'a Idempotency<S, C>,
    Vec<(RecordId, Option<Fingerprint>)>,
) -> BoxFuture<'a, Vec<ClaimedAhead>>;

/// The executor's claim of a window, as a [`ClaimAhead`].
pub(crate) fn claim_many<S: ClaimMany, C: Codec>(
    idem: &Idempotency<S, C>,
    runs: Vec<(RecordId, Option<Fingerprint>)>,
) -> BoxFuture<'_, Vec<ClaimedAhead>> {
    Box::pin(idem.claim_ahead(runs))
}
