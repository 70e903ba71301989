//! What operators and the admin tools ask of the store: get, ttl, delete,
//! list, abandoned records, purge.

use std::time::Duration;

use idem::{
    DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, PurgeExpired, Record,
    RecordId, RecordTtl, Scope, StoreError,
};
use mysql_async::Value;
use sha2::{Digest, Sha256};

use crate::encode;
use crate::store::{id_params, MySqlStore};

fn text(value: Option<&str>) -> Value {
    value.map_or(Value::NULL, |s| Value::Bytes(s.as_bytes().to_vec()))
}

fn count(n: usize) -> Value {
    Value::UInt(u64::try_from(n).unwrap_or(u64::MAX))
}

impl GetRecord for MySqlStore {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let rows = self
            .query(&self.inner.sql.get, id_params(id).to_vec())
            .await?;
        rows.first()
            .map(|r| encode::record(r).map(|(_, record)| record))
            .transpose()
    }
}

impl RecordTtl for MySqlStore {
    async fn ttl(&self, id: &RecordId, response: &[u8]) -> Result<Option<Duration>, StoreError> {
        // The response's digest, not the response: 32 bytes on the wire.
        let mut params = id_params(id).to_vec();
        params.push(Value::Bytes(Sha256::digest(response).to_vec()));
        let rows = self.query(&self.inner.sql.ttl, params).await?;
        Ok(rows
            .first()
            .and_then(|r| encode::int_at(r, 0))
            .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())))
    }
}

impl DeleteRecord for MySqlStore {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let live = self
            .write(&self.inner.sql.delete_live, id_params(id).to_vec())
            .await?;
        // An expired record is left to the purge when the database
        // remembers: the purge remembers its key as it drops it.
        if live == 0 && self.remembers_expired().is_none() {
            self.write(&self.inner.sql.delete, id_params(id).to_vec())
                .await?;
        }
        Ok(live > 0)
    }
}

impl ListRecords for MySqlStore {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let state = text(query.state.map(|s| s.as_str()));
        let scope = text(query.scope.as_ref().map(|s| s.as_str()));
        let after_scope = text(query.after.as_ref().map(|a| a.scope().as_str()));
        let after_key = text(query.after.as_ref().map(|a| a.key().as_str()));
        let rows = self
            .query(
                &self.inner.sql.list,
                vec![
                    state.clone(),
                    state,
                    scope.clone(),
                    scope,
                    after_scope.clone(),
                    after_scope,
                    after_key,
                    count(query.limit),
                ],
            )
            .await?;
        let records = rows
            .iter()
            .map(encode::record)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ListPage::ordered(records, query.limit))
    }
}

impl FindAbandoned for MySqlStore {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.abandoned,
                vec![text(Some(scope.as_str())), count(limit)],
            )
            .await?;
        rows.iter().map(encode::record).collect()
    }
}

impl PurgeExpired for MySqlStore {
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        if let Some(memory) = self.remembers_expired() {
            return self.purge_remembering(limit, memory).await;
        }
        let changed = self
            .write(&self.inner.sql.purge, vec![count(limit)])
            .await?;
        Ok(usize::try_from(changed).unwrap_or(usize::MAX))
    }
}
