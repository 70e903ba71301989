//! Claims and completions many at a time: one writer job each, committed
//! in one transaction.

use idem::{ClaimMany, Clock, CompleteMany, RecordId, StoreError};

use idem::store::{ClaimOutcome, ClaimParams, Completion};

use crate::jobs::{Done, Op};
use crate::store::SqliteStore;

impl<C: Clock> ClaimMany for SqliteStore<C> {
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        match self.submit(Op::Claim(claims.to_vec())).await? {
            Done::Claims(outcomes) => Ok(outcomes),
            _ => unreachable!("a claim job is answered with Done::Claims"),
        }
    }
}

impl<C: Clock> CompleteMany for SqliteStore<C> {
    /// The completions go to the writer as one job, so they commit in one
    /// transaction with whatever else that batch carries.
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        match self.submit(Op::Complete(completions.to_vec())).await? {
            Done::Completes(written) => Ok(written),
            _ => unreachable!("a completion job is answered with Done::Completes"),
        }
    }
}
