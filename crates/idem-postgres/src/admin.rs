//! What operators and the admin tools ask of the store: get, ttl, delete,
//! list, abandoned records, purge.

use std::time::Duration;

use idem::{
    DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, PurgeExpired, Record,
    RecordId, RecordTtl, Scope, StoreError,
};
use sha2::{Digest, Sha256};

use crate::encode;
use crate::store::PgStore;

impl GetRecord for PgStore {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.get,
                &[&id.scope().as_str(), &id.key().as_str()],
            )
            .await?;
        rows.first()
            .map(|r| encode::record(r).map(|(_, record)| record))
            .transpose()
    }
}

impl RecordTtl for PgStore {
    async fn ttl(&self, id: &RecordId, response: &[u8]) -> Result<Option<Duration>, StoreError> {
        // The response's digest, not the response: 32 bytes on the wire.
        let digest = Sha256::digest(response).to_vec();
        let rows = self
            .query(
                &self.inner.sql.ttl,
                &[&id.scope().as_str(), &id.key().as_str(), &digest],
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r.try_get::<_, i64>(0).ok())
            .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())))
    }
}

impl DeleteRecord for PgStore {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.delete,
                &[
                    &id.scope().as_str(),
                    &id.key().as_str(),
                    &self.remembers_expired().is_some(),
                ],
            )
            .await?;
        Ok(rows
            .first()
            .is_some_and(|r| r.try_get::<_, bool>(0).unwrap_or(false)))
    }
}

impl ListRecords for PgStore {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                &self.inner.sql.list,
                &[
                    &query.state.map(|s| s.as_str()),
                    &query.scope.as_ref().map(|s| s.as_str()),
                    &query.after.as_ref().map(|a| a.scope().as_str()),
                    &query.after.as_ref().map(|a| a.key().as_str()),
                    &limit,
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

impl FindAbandoned for PgStore {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(&self.inner.sql.abandoned, &[&scope.as_str(), &limit])
            .await?;
        rows.iter().map(encode::record).collect()
    }
}

impl PurgeExpired for PgStore {
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let Some(memory) = self.remembers_expired() else {
            let changed = self.write(&self.inner.sql.purge, &[&limit]).await?;
            return Ok(usize::try_from(changed).unwrap_or(usize::MAX));
        };
        let first_day = idem::horizon::first_kept_day(idem::Timestamp::now(), memory);
        let day = i32::try_from(first_day).unwrap_or(i32::MAX);
        let rows = self
            .query(&self.inner.sql.purge_remembering, &[&limit, &day])
            .await?;
        let purged: i64 = rows.first().map_or(0, |row| row.get(0));
        Ok(usize::try_from(purged).unwrap_or(0))
    }
}
