//! The step journal: `<schema>.idem_steps`, written under the record's
//! lease.

use bytes::Bytes;
use idem::store::{Lease, StepBegin};
use idem::{RecordId, Resolution, Resolved, StepEntry, StepJournal, StoreError};

use crate::encode::{self, token_bytes};
use crate::store::{lease_written, PgStore};

impl StepJournal for PgStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let attempt = i32::try_from(lease.attempt).unwrap_or(i32::MAX);
        let rows = self
            .query(
                &self.inner.sql.step_begin,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &step,
                    &attempt,
                ],
            )
            .await?;
        encode::step_begin(&lease.id, lease.attempt, rows.first())
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let changed = self
            .write(
                &self.inner.sql.step_finish,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &step,
                    &&result[..],
                ],
            )
            .await?;
        lease_written(changed)
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.steps,
                &[&id.scope().as_str(), &id.key().as_str()],
            )
            .await?;
        rows.iter().map(|r| encode::step_entry(id, r)).collect()
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let (applied, result) = resolution.into_parts();
        let rows = self
            .query(
                &self.inner.sql.resolve,
                &[
                    &id.scope().as_str(),
                    &id.key().as_str(),
                    &step,
                    &applied,
                    &&result[..],
                ],
            )
            .await?;
        encode::resolved(id, rows.first())
    }
}
