//! The step journal: a hash beside the record, written by scripts that
//! check the holder's token.

use bytes::Bytes;
use idem::store::{Lease, StepBegin};
use idem::{RecordId, Resolution, Resolved, StepEntry, StepJournal, StoreError};
use redis::Value;

use crate::error::{damaged, store_error};
use crate::store::{written, RedisStore};
use crate::{encode, scripts};

impl RedisStore {
    /// Runs a step-journal script, whose first argument is the holder's
    /// token.
    async fn journal_write(
        &self,
        script: &scripts::Script,
        lease: &Lease,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let key = self.record_key(&lease.id);
        let token = lease.token.to_hex();
        let mut all: Vec<&[u8]> = Vec::with_capacity(args.len() + 1);
        all.push(token.as_bytes());
        all.extend_from_slice(args);
        script
            .run(&self.inner.conn, &key, &all, false)
            .await
            .map_err(|e| damaged(&lease.id, store_error(e)))
    }
}

impl StepJournal for RedisStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let attempt = lease.attempt.to_string();
        let reply = self
            .journal_write(
                &self.inner.scripts.step_begin,
                lease,
                &[step.as_bytes(), attempt.as_bytes()],
            )
            .await?;
        encode::step_begin(&lease.id, lease.attempt, reply)
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let reply = self
            .journal_write(
                &self.inner.scripts.step_finish,
                lease,
                &[step.as_bytes(), &result],
            )
            .await?;
        written(&lease.id, reply)
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let key = self.record_key(id);
        let reply = self
            .inner
            .scripts
            .steps
            .run(&self.inner.conn, &key, &[], false)
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        encode::steps(id, reply)
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let key = self.record_key(id);
        let (kind, result): (&[u8], Bytes) = match resolution {
            Resolution::Applied(result) => (b"a", result),
            Resolution::NotApplied => (b"n", Bytes::new()),
        };
        let reply = self
            .inner
            .scripts
            .resolve
            .run(
                &self.inner.conn,
                &key,
                &[step.as_bytes(), kind, &result],
                self.remembers(),
            )
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        encode::resolved(id, reply)
    }
}
