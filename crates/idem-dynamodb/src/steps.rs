//! The step journal: a map in the record's own item, written on the
//! condition that the holder's lease holds.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::ReturnValue;
use bytes::Bytes;
use idem::store::{Lease, StepBegin};
use idem::{RecordId, Resolution, Resolved, StepEntry, StepJournal, StoreError};

use idem::machine;

use crate::encode::{self, Step};
use crate::horizon;
use crate::request::{held_values, Update, Written, HELD};
use crate::store::DynamoStore;
use crate::store::MAX_RACES;

impl StepJournal for DynamoStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let now = self.now();
        let nonce = self.inner.mint.next();
        let mut values = held_values(lease, now);
        values.insert(":started".to_owned(), encode::started(lease.attempt, nonce));
        let op = Update {
            update: "SET j.#n = :started, v = v + :one",
            condition: &format!(
                "{HELD} AND (attribute_not_exists(j.#n) OR attribute_exists(j.#n.a))"
            ),
            values,
            names: HashMap::from([("#n".to_owned(), step.to_owned())]),
            returns: ReturnValue::UpdatedOld,
        };
        match self.inner.table.update(&lease.id, op).await? {
            Written::Done(old) => {
                let before = old
                    .as_ref()
                    .and_then(|o| o.get("j"))
                    .and_then(|j| j.as_m().ok())
                    .and_then(|j| j.get(step));
                let Some(before) = before else {
                    return Ok(StepBegin::Fresh);
                };
                let before = encode::decode_step(before).map_err(|reason| StoreError::Corrupt {
                    id: lease.id.to_string(),
                    reason,
                })?;
                match before {
                    // Our own mark: the SDK retried this request after its answer was lost.
                    Step::Started { nonce: mark, .. } if mark == nonce => Ok(StepBegin::Fresh),
                    Step::Started { attempt, .. } => {
                        Ok(idem::machine::step_begun(attempt, lease.attempt))
                    }
                    Step::Done(result) => Ok(StepBegin::Done(result)),
                }
            }
            Written::Refused(old) => {
                let old = old
                    .map(|i| encode::decode(&i, Some(&lease.id)))
                    .transpose()?;
                let old = old.filter(|o| machine::held(Some(&o.record), lease.token, now).is_ok());
                match old.as_ref().map(|o| o.step(step)).transpose()?.flatten() {
                    Some(Step::Done(result)) => Ok(StepBegin::Done(result)),
                    _ => Err(StoreError::LeaseLost),
                }
            }
        }
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut values = held_values(lease, now);
        values.insert(":done".to_owned(), encode::done(&result));
        let op = Update {
            update: "SET j.#n = :done, v = v + :one",
            condition: HELD,
            values,
            names: HashMap::from([("#n".to_owned(), step.to_owned())]),
            returns: ReturnValue::None,
        };
        match self.inner.table.update(&lease.id, op).await? {
            Written::Done(_) => Ok(()),
            Written::Refused(_) => Err(StoreError::LeaseLost),
        }
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        match self.live(id).await? {
            Some(stored) => stored.steps(),
            None => Ok(Vec::new()),
        }
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        for _ in 0..MAX_RACES {
            let now = self.now();
            let seen = self.inner.table.read(id).await?;
            let current = match &seen {
                Some(seen) => seen.step(step)?.map(|s| match s {
                    Step::Started { attempt, .. } => idem::StepState::Started { attempt },
                    Step::Done(result) => idem::StepState::Done { result },
                }),
                None => None,
            };
            let (record, new_step) = match machine::decide_resolve(
                seen.as_ref().map(|s| &s.record),
                current.as_ref(),
                resolution.clone(),
                now,
            ) {
                Ok(decided) => decided,
                Err(answer) => return Ok(answer),
            };
            let mut seen = seen.expect("a resolution needs a record");
            // A parked record ended (failed, outcome unknown) and so left
            // its own memory; released, it never ended: the memory goes
            // (one carried from an earlier request under the key stays).
            horizon::forget_own(id, &mut seen);
            let mut journal = seen.journal.clone();
            match &new_step {
                Some(state) => journal.insert(step.to_owned(), encode::step_value(state)),
                None => journal.remove(step),
            };
            if let Written::Done(_) = self
                .replace(id, Some(&seen), &record, None, journal)
                .await?
            {
                return Ok(Resolved::Released);
            }
        }
        Err(StoreError::Backend(
            "resolve lost too many races on its item".into(),
        ))
    }
}
