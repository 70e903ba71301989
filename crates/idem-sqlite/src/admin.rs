//! What operators and the admin tools ask of the store: get, delete,
//! list, abandoned records, purge.

use idem::{
    Clock, DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, PurgeExpired,
    Record, RecordId, Scope, StoreError,
};
use rusqlite::types::Value;

use crate::encode;
use crate::errors::corrupt;
use crate::jobs::{Done, Op};
use crate::store::SqliteStore;

impl<C: Clock> GetRecord for SqliteStore<C> {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let now = self.inner.clock.now();
        match self.read(|conn| encode::load(conn, id)).await? {
            None => Ok(None),
            Some((_, Ok(record))) => Ok((!record.is_expired(now)).then_some(record)),
            Some((_, Err(reason))) => Err(corrupt(id, reason)),
        }
    }
}

impl<C: Clock> DeleteRecord for SqliteStore<C> {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        match self.submit(Op::Delete(id.clone())).await? {
            Done::Delete(live) => Ok(live),
            _ => unreachable!("a delete job is answered with Done::Delete"),
        }
    }
}

/// The SQL for one page and its values, with only the filters in use, so
/// SQLite seeks in the `(scope, key)` index instead of scanning from the
/// start on every page (`+expires_at` keeps the expiry index out of it).
/// `None` when the page is empty by construction (a cursor past the scope).
fn list_sql(query: &ListQuery, now: i64, limit: usize) -> Option<(String, Vec<Value>)> {
    let mut sql = String::from(concat!(
        "SELECT scope, key, ",
        encode::columns!(),
        " FROM idem_records WHERE +expires_at > ?"
    ));
    let mut values = vec![Value::Integer(now)];
    if let Some(state) = query.state {
        sql.push_str(" AND state = ?");
        values.push(Value::Integer(encode::state_code(state)));
    }
    let text = |s: &str| Value::Text(s.to_owned());
    match (&query.scope, &query.after) {
        (Some(scope), Some(after)) if after.scope() == scope => {
            sql.push_str(" AND scope = ? AND key > ?");
            values.extend([text(scope.as_str()), text(after.key().as_str())]);
        }
        (Some(scope), Some(after)) if after.scope() > scope => return None,
        (Some(scope), _) => {
            sql.push_str(" AND scope = ?");
            values.push(text(scope.as_str()));
        }
        (None, Some(after)) => {
            sql.push_str(" AND (scope, key) > (?, ?)");
            values.extend([text(after.scope().as_str()), text(after.key().as_str())]);
        }
        (None, None) => {}
    }
    sql.push_str(" ORDER BY scope, key LIMIT ?");
    values.push(Value::Integer(
        i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX),
    ));
    Some((sql, values))
}

impl<C: Clock> SqliteStore<C> {
    /// Runs a query selecting `scope, key, ` and the record's columns.
    async fn read_rows(
        &self,
        sql: &str,
        values: Vec<Value>,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let rows = self
            .read(|conn| {
                let mut stmt = conn.prepare_cached(sql)?;
                let rows = stmt.query_map(rusqlite::params_from_iter(values.iter()), |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        encode::decode(r, 2),
                    ))
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await?;
        let mut records = Vec::with_capacity(rows.len());
        for (scope, key, record) in rows {
            let id = Scope::new(&scope)
                .and_then(|s| Ok(RecordId::new(s, encode::stored_key_rules().parse(&key)?)))
                .map_err(|e| StoreError::Corrupt {
                    id: format!("{scope}/{key}"),
                    reason: e.to_string(),
                })?;
            let record = record.map_err(|reason| corrupt(&id, reason))?;
            records.push((id, record));
        }
        Ok(records)
    }
}

/// Abandoned records of a scope, longest-abandoned first: `state = 0` is
/// written out so that SQLite walks the partial index of in-progress rows
/// (`0003_abandoned.sql`) in `lease_until` order.
const ABANDONED_SQL: &str = concat!(
    "SELECT scope, key, ",
    encode::columns!(),
    " FROM idem_records WHERE state = 0 AND scope = ?1 AND lease_until <= ?2",
    " AND +expires_at > ?2 ORDER BY lease_until LIMIT ?3"
);

impl<C: Clock> FindAbandoned for SqliteStore<C> {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let now = encode::millis(self.inner.clock.now());
        let values = vec![
            Value::Text(scope.as_str().to_owned()),
            Value::Integer(now),
            Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)),
        ];
        self.read_rows(ABANDONED_SQL, values).await
    }
}

impl<C: Clock> ListRecords for SqliteStore<C> {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let now = encode::millis(self.inner.clock.now());
        let limit = query.limit.max(1);
        let Some((sql, values)) = list_sql(query, now, limit) else {
            return Ok(ListPage {
                records: Vec::new(),
                next: None,
            });
        };
        let mut records = self.read_rows(&sql, values).await?;
        let next = (records.len() > limit).then(|| records[limit - 1].0.clone());
        records.truncate(limit);
        Ok(ListPage { records, next })
    }
}

impl<C: Clock> PurgeExpired for SqliteStore<C> {
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        match self.submit(Op::Purge(limit)).await? {
            Done::Purge(n) => Ok(n),
            _ => unreachable!("a purge job is answered with Done::Purge"),
        }
    }
}

#[cfg(test)]
mod tests {
    use idem::StateKind;
    use rusqlite::Connection;

    use super::*;
    use crate::schema::{self, Durability, Role};
    use crate::DEFAULT_BUSY_TIMEOUT;

    fn plan(conn: &Connection, query: &ListQuery) -> String {
        let (sql, values) = list_sql(query, 0, 10).expect("a query");
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("prepare");
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values.iter()), |r| {
                r.get::<_, String>(3)
            })
            .expect("explain");
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows")
            .join("; ")
    }

    #[test]
    fn pages_seek_in_the_key_index_and_never_sort() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plan.db");
        let mut conn = schema::connect(&path, Durability::Full, DEFAULT_BUSY_TIMEOUT, Role::Writer)
            .expect("open");
        schema::migrate(&mut conn, &path, DEFAULT_BUSY_TIMEOUT).expect("migrate");
        let scope = Scope::new("s").expect("valid");
        let after = RecordId::parse("s", "k5").expect("valid");
        let queries = [
            ListQuery::new(10).after(after.clone()),
            ListQuery::new(10).scope(scope.clone()).after(after.clone()),
            ListQuery::new(10)
                .scope(scope.clone())
                .state(StateKind::Completed),
            ListQuery::new(10),
        ];
        for (i, query) in queries.iter().enumerate() {
            let plan = plan(&conn, query);
            assert!(!plan.contains("TEMP B-TREE"), "query {i} sorts: {plan}");
            assert!(
                !plan.contains("expires_at"),
                "query {i} walks the expiry index: {plan}"
            );
            if i < 3 {
                assert!(
                    plan.starts_with("SEARCH"),
                    "query {i} scans instead of seeking: {plan}"
                );
            }
        }
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {ABANDONED_SQL}"))
            .expect("prepare");
        let plan = stmt
            .query_map(rusqlite::params!["s", 0, 10], |r| r.get::<_, String>(3))
            .expect("explain")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows")
            .join("; ");
        assert!(
            plan.starts_with("SEARCH") && plan.contains("idem_records_abandoned"),
            "the abandoned query does not seek in its index: {plan}"
        );
        assert!(
            !plan.contains("TEMP B-TREE"),
            "the abandoned query sorts: {plan}"
        );
        let past = ListQuery::new(10)
            .scope(scope)
            .after(RecordId::parse("t", "k").expect("valid"));
        assert!(
            list_sql(&past, 0, 10).is_none(),
            "a cursor past the scope is an empty page"
        );
    }
}
