//! A store whose server is down: every call fails with
//! [`StoreError::Unavailable`]. A stand-in for tests of what callers do
//! when the store cannot be reached (fail closed, fail open, retry later);
//! real outages are proven against real servers through the fault proxy.

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease};
use idem::{Failure, RecordId, Store, StoreError, Timestamp};

/// A store that cannot be reached.
#[derive(Debug, Clone, Copy, Default)]
pub struct DownStore;

fn down() -> StoreError {
    StoreError::Unavailable("connection refused".into())
}

impl Store for DownStore {
    async fn claim(&self, _: &RecordId, _: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        Err(down())
    }

    async fn complete(&self, _: &Lease, _: Bytes, _: Duration) -> Result<(), StoreError> {
        Err(down())
    }

    async fn fail(&self, _: &Lease, _: Failure, _: Duration) -> Result<(), StoreError> {
        Err(down())
    }

    async fn extend(&self, _: &Lease, _: Duration) -> Result<Timestamp, StoreError> {
        Err(down())
    }

    async fn release(&self, _: &Lease) -> Result<(), StoreError> {
        Err(down())
    }
}
