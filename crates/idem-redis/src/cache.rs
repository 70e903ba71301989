//! Redis as the replay cache of [`idem::cache::Cached`], in front of a
//! system of record such as PostgreSQL: every process sharing the Redis
//! server (or Cluster) shares the cached replays.

use std::time::Duration;

use idem::cache::{CachedReplay, ReplayCache};
use idem::{RecordId, StoreError};
use redis::Value;

use crate::error::store_error;
use crate::store::RedisStore;

/// Completed replays kept in Redis with `PX` expiry, under
/// `<namespace>.replay:` keys (outside the store's own `<namespace>:`
/// keys, so listing and purging records never sees them). Made by
/// [`RedisStore::replay_cache`]; shares the store's connection.
#[derive(Debug, Clone)]
pub struct RedisReplayCache {
    store: RedisStore,
}

impl RedisStore {
    /// A replay cache on this store's connection and namespace.
    pub fn replay_cache(&self) -> RedisReplayCache {
        RedisReplayCache {
            store: self.clone(),
        }
    }
}

impl RedisReplayCache {
    /// The Redis key of `id`'s cached replay (the record key's hash tag,
    /// under `<namespace>.replay:`).
    pub fn key(&self, id: &RecordId) -> String {
        let record = self.store.record_key(id);
        let ns = self.store.namespace();
        format!("{ns}.replay{}", &record[ns.len()..])
    }
}

impl ReplayCache for RedisReplayCache {
    async fn get(&self, id: &RecordId) -> Result<Option<CachedReplay>, StoreError> {
        let key = self.key(id);
        let reply = self
            .store
            .inner
            .conn
            .query_key(redis::cmd("GET").arg(&key), &key)
            .await
            .map_err(store_error)?;
        match reply {
            Value::Nil => Ok(None),
            Value::BulkString(bytes) => {
                CachedReplay::decode(&bytes)
                    .map(Some)
                    .ok_or_else(|| StoreError::Corrupt {
                        id: id.to_string(),
                        reason: "cached replay does not decode".into(),
                    })
            }
            other => Err(StoreError::Backend(
                format!("GET {key} replied {other:?}").into(),
            )),
        }
    }

    async fn put(
        &self,
        id: &RecordId,
        replay: CachedReplay,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let ms = u64::try_from(idem::store::held(ttl).as_millis()).unwrap_or(u64::MAX);
        if ms == 0 {
            return Ok(());
        }
        let key = self.key(id);
        self.store
            .inner
            .conn
            .query_key(
                redis::cmd("SET")
                    .arg(&key)
                    .arg(replay.encode())
                    .arg("PX")
                    .arg(ms),
                &key,
            )
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn remove(&self, id: &RecordId) -> Result<(), StoreError> {
        let key = self.key(id);
        self.store
            .inner
            .conn
            .query_key(redis::cmd("DEL").arg(&key), &key)
            .await
            .map_err(store_error)?;
        Ok(())
    }
}
