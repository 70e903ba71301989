//! The step journal, written through the writer under the record's lease.

use bytes::Bytes;
use idem::store::{Lease, StepBegin};
use idem::{Clock, RecordId, Resolution, Resolved, StepEntry, StepJournal, StoreError};

use crate::encode;
use crate::errors::corrupt;
use crate::jobs::{Done, Op};
use crate::store::SqliteStore;

impl<C: Clock> StepJournal for SqliteStore<C> {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let op = Op::BeginStep {
            lease: lease.clone(),
            step: step.to_owned(),
        };
        match self.submit(op).await? {
            Done::BeginStep(result) => result,
            _ => unreachable!("a begin_step job is answered with Done::BeginStep"),
        }
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let op = Op::FinishStep {
            lease: lease.clone(),
            step: step.to_owned(),
            result,
        };
        match self.submit(op).await? {
            Done::FinishStep(result) => result,
            _ => unreachable!("a finish_step job is answered with Done::FinishStep"),
        }
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let now = self.inner.clock.now();
        let (record, steps) = self
            .read(|conn| Ok((encode::load(conn, id)?, encode::load_steps(conn, id)?)))
            .await?;
        match record {
            Some((_, Ok(record))) if !record.is_expired(now) => Ok(steps),
            Some((_, Err(reason))) => Err(corrupt(id, reason)),
            _ => Ok(Vec::new()),
        }
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let op = Op::Resolve {
            id: id.clone(),
            step: step.to_owned(),
            resolution,
        };
        match self.submit(op).await? {
            Done::Resolve(result) => result,
            _ => unreachable!("a resolve job is answered with Done::Resolve"),
        }
    }
}
