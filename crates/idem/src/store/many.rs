//! Group commit: many claims or completions in one round trip.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use super::{Store, StoreError};
use crate::key::RecordId;
use crate::record::{ClaimOutcome, ClaimParams, Lease};

/// Claims many records in one round trip. Each claim is atomic on its own;
/// the batch as a whole is not a transaction.
pub trait ClaimMany: Store {
    /// One result per claim, in order.
    fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> impl Future<Output = Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError>> + Send;
}

/// One completion for [`CompleteMany`]: what [`Store::complete`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The holder's lease; the record must still carry its token.
    pub lease: Lease,
    /// The outcome to store.
    pub response: Bytes,
    /// How long the outcome is kept.
    pub retention: Duration,
    /// For a store with a pending index
    /// ([`PendingSends`](super::PendingSends)): the run is marked pending
    /// by this completion, held for this long
    /// ([`complete_pending`](super::PendingSends::complete_pending)).
    /// `None`, a plain completion, is all a store without one is handed.
    pub pending: Option<Duration>,
}

impl Completion {
    /// The completion of `lease` with `response`, kept for `retention`.
    pub fn new(lease: Lease, response: Bytes, retention: Duration) -> Self {
        Self {
            lease,
            response,
            retention,
            pending: None,
        }
    }

    /// The same completion marking the run pending, held for `hold`.
    #[must_use]
    pub fn marked_pending(mut self, hold: Duration) -> Self {
        self.pending = Some(hold);
        self
    }
}

/// Completes many records in one round trip. Each completion is atomic on
/// its own and checked against its own lease's token, exactly as
/// [`Store::complete`] would check it; the batch as a whole is not a
/// transaction, so one lease lost fails that entry alone.
pub trait CompleteMany: Store {
    /// One result per completion, in order: `Ok(())` if stored,
    /// [`StoreError::LeaseLost`] (nothing written) or another error for
    /// that entry alone. The outer error means no answer came for the
    /// batch, so whether any completion landed is unknown.
    fn complete_many(
        &self,
        completions: &[Completion],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send;
}
