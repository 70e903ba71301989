//! The step journal: `idem_steps`, written under the record's lease.

use bytes::Bytes;
use idem::store::{Lease, StepBegin};
use idem::{RecordId, Resolution, Resolved, StepEntry, StepJournal, StoreError};
use mysql_async::Value;

use crate::encode;
use crate::sql;
use crate::store::{id_params, lease_params, lease_written, MySqlStore};

impl StepJournal for MySqlStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let mut params = lease_params(lease).to_vec();
        params.push(Value::Bytes(step.as_bytes().to_vec()));
        params.push(Value::Int(i64::from(lease.attempt)));
        let rows = self.query(sql::STEP_BEGIN, params).await?;
        encode::step_begin(&lease.id, lease.attempt, rows.first())
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let mut params = lease_params(lease).to_vec();
        params.push(Value::Bytes(step.as_bytes().to_vec()));
        params.push(Value::Bytes(result.to_vec()));
        let rows = self.query(sql::STEP_FINISH, params).await?;
        let held = rows.first().and_then(|r| encode::int_at(r, 0)) == Some(1);
        lease_written(u64::from(held))
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let rows = self
            .query(&self.inner.sql.steps, id_params(id).to_vec())
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
        let mut params = id_params(id).to_vec();
        params.push(Value::Bytes(step.as_bytes().to_vec()));
        params.push(Value::Int(i64::from(applied)));
        params.push(Value::Bytes(result.to_vec()));
        let rows = self.query(sql::RESOLVE, params).await?;
        encode::resolved(id, rows.first())
    }
}
