//! Reading, deleting, listing and purging records, by scanning the
//! namespace on every master.

use idem::{
    DeleteRecord, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, PurgeExpired, Record,
    RecordId, Scope, State, StoreError,
};
use redis::Value;

use crate::conn::{slots, Conn};
use crate::encode;
use crate::error::{damaged, store_error};
use crate::store::RedisStore;

impl RedisStore {
    /// Every key of this namespace (and scope, if given), one scan page at
    /// a time, over every master of a Cluster.
    async fn scan(&self, scope: Option<&Scope>) -> Result<Scan, StoreError> {
        self.scan_matching(self.scope_pattern(scope)).await
    }

    /// Every key matching `pattern`, one scan page at a time, over every
    /// master of a Cluster.
    pub(crate) async fn scan_matching(&self, pattern: String) -> Result<Scan, StoreError> {
        Ok(Scan {
            pattern,
            nodes: self.servers().await?,
            cursor: 0,
        })
    }

    /// The servers holding records: the Cluster's masters from `CLUSTER
    /// SLOTS`, or `None` for the one server of a standalone store (as
    /// [`Conn::query_node`] takes them).
    async fn servers(&self) -> Result<Vec<Option<(String, u16)>>, StoreError> {
        if let Conn::Standalone(_) = self.inner.conn {
            return Ok(vec![None]);
        }
        let reply = self
            .inner
            .conn
            .query(redis::cmd("CLUSTER").arg("SLOTS"))
            .await
            .map_err(store_error)?;
        let ranges = slots::parse(&reply).ok_or_else(|| {
            StoreError::Backend(format!("unexpected CLUSTER SLOTS reply {reply:?}").into())
        })?;
        let mut masters = Vec::new();
        for (_, _, addr) in ranges {
            if !masters.contains(&Some(addr.clone())) {
                masters.push(Some(addr));
            }
        }
        Ok(masters)
    }

    /// Loads every script on the servers this store reaches now (a Cluster:
    /// every master). Optional: a server that lacks a script gets it on
    /// first use.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let batch = self.inner.batcher.as_ref().map(|b| b.get_ref().script());
        for node in self.servers().await? {
            for script in self.inner.scripts.all().into_iter().chain(batch) {
                self.inner
                    .conn
                    .query_node(script.load(), node.clone())
                    .await
                    .map_err(store_error)?;
            }
        }
        Ok(())
    }
}

/// A scan over the masters, one page at a time.
pub(crate) struct Scan {
    pattern: String,
    /// The nodes left to scan, the current one first (`None`: the one
    /// server of a standalone store).
    nodes: Vec<Option<(String, u16)>>,
    cursor: u64,
}

impl Scan {
    /// The next page of keys, or `None` when every node is done.
    pub(crate) async fn next(&mut self, conn: &Conn) -> Result<Option<Vec<String>>, StoreError> {
        let Some(node) = self.nodes.first().cloned() else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = conn.query_node(cmd, node).await.map_err(store_error)?;
        let (cursor, keys): (u64, Vec<String>) = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Backend(format!("unexpected SCAN reply: {e}").into()))?;
        self.cursor = cursor;
        if cursor == 0 {
            self.nodes.remove(0);
        }
        Ok(Some(keys))
    }
}

/// Redis keeps no index of leases (a Cluster could not update one
/// atomically with the record), so a call scans the scope's keys and asks
/// each record's server whether it is abandoned, by the server's clock: a
/// sweep costs one scan page per 1000 keys and one script call per key of
/// the scope, and ends early once `limit` are found.
impl FindAbandoned for RedisStore {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let mut scan = self.scan(Some(scope)).await?;
        let mut found: Vec<(RecordId, Record)> = Vec::new();
        while found.len() < limit {
            let Some(keys) = scan.next(&self.inner.conn).await? else {
                break;
            };
            let calls: Vec<(String, Vec<Vec<u8>>)> = keys
                .into_iter()
                .map(|k| (k, vec![b"abandoned".to_vec()]))
                .collect();
            let replies = self.run_each(&self.inner.scripts.get, &calls, false).await;
            for ((key, _), reply) in calls.iter().zip(replies) {
                let reply = reply.map_err(|e| damaged(key, e))?;
                if let Some((id, record)) = encode::record(None, reply)? {
                    if id.scope() == scope {
                        found.push((id, record));
                    }
                }
            }
        }
        found.sort_by_key(|(_, r)| match r.state {
            State::InProgress { lease_until, .. } => Some(lease_until),
            _ => None,
        });
        found.truncate(limit);
        Ok(found)
    }
}

impl GetRecord for RedisStore {
    /// With replica acknowledgements on, the read counts only once the
    /// replicas have the record as read (it is written again as it is, so
    /// that the `WAIT` behind it covers the writes of other connections):
    /// a read-back never confirms a write a failover could lose.
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let key = self.record_key(id);
        let sync: &[&[u8]] = if self.inner.conn.acks_replicas() {
            &[b"sync"]
        } else {
            &[]
        };
        let reply = self
            .inner
            .scripts
            .get
            .run(&self.inner.conn, &key, sync, false)
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        Ok(encode::record(Some(id), reply)?.map(|(_, r)| r))
    }
}

impl DeleteRecord for RedisStore {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let key = self.record_key(id);
        let reply = self
            .inner
            .scripts
            .delete
            .run(
                &self.inner.conn,
                &key,
                &[&self.inner.grace_ms],
                self.remembers(),
            )
            .await
            .map_err(|e| damaged(id, store_error(e)))?;
        Ok(matches!(reply, Value::Int(1)))
    }
}

impl ListRecords for RedisStore {
    /// Lists by scanning the namespace (or, with a scope filter, only that
    /// scope's keys) on every master and sorting what is live. Each page
    /// costs a full scan: this is for administration, not hot paths.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let mut scan = self.scan(query.scope.as_ref()).await?;
        let mut found: Vec<(RecordId, Record)> = Vec::new();
        while let Some(keys) = scan.next(&self.inner.conn).await? {
            let calls: Vec<(String, Vec<Vec<u8>>)> =
                keys.into_iter().map(|k| (k, Vec::new())).collect();
            let replies = self.run_each(&self.inner.scripts.get, &calls, false).await;
            for ((key, _), reply) in calls.iter().zip(replies) {
                let reply = reply.map_err(|e| damaged(key, e))?;
                let Some((id, record)) = encode::record(None, reply)? else {
                    continue;
                };
                let wanted = query.scope.as_ref().is_none_or(|s| id.scope() == s)
                    && query.state.is_none_or(|s| record.state.kind() == s)
                    && query.after.as_ref().is_none_or(|after| id > *after);
                if wanted {
                    found.push((id, record));
                }
            }
        }
        Ok(ListPage::first_of(found, query.limit))
    }
}

impl PurgeExpired for RedisStore {
    /// Redis drops records by itself a grace period after their deadline;
    /// this frees them sooner. Each call scans the namespace until `limit`
    /// records were removed.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let mut scan = self.scan(None).await?;
        let mut purged = 0;
        while purged < limit {
            let Some(keys) = scan.next(&self.inner.conn).await? else {
                break;
            };
            // Each round sends at most as many purges as are still allowed,
            // so a batch never removes more than `limit`, however many of
            // the earlier ones found nothing to remove.
            let mut rest = keys.as_slice();
            while purged < limit && !rest.is_empty() {
                let (chunk, tail) = rest.split_at((limit - purged).min(rest.len()));
                rest = tail;
                let calls: Vec<(String, Vec<Vec<u8>>)> =
                    chunk.iter().map(|k| (k.clone(), Vec::new())).collect();
                let replies = self
                    .run_each(&self.inner.scripts.purge, &calls, false)
                    .await;
                for ((key, _), reply) in calls.iter().zip(replies) {
                    if matches!(reply.map_err(|e| damaged(key, e))?, Value::Int(1)) {
                        purged += 1;
                    }
                }
            }
        }
        Ok(purged)
    }
}
