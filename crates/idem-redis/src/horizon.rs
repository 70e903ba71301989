//! Keys remembered past their retention ([`idem::horizon`]) on Redis: the
//! namespace's setting, and what the scripts are told.
//!
//! Redis drops a record by its expiry, with nothing to run as it goes, so
//! the record's memory is written by its end: `complete` and `fail` keep,
//! beside a record that ends, a small key in its slot (`<record key>:h`:
//! the day its retention ends and the fingerprint's first bytes) that
//! Redis keeps for the memory past that day; a claim that would start the
//! key afresh reads it (`late_retry` in `lua/prelude.lua`, which mirrors
//! [`idem::horizon::late_retry`]). The setting is kept in the namespace
//! (`<namespace>:remember_ms`), so every process on it remembers alike.

use std::time::Duration;

use bytes::Bytes;
use idem::RecordId;
use redis::{RedisResult, Value};

use crate::conn::Conn;
use crate::store::{millis, RedisStore};

impl RedisStore {
    /// How long the namespace remembers expired keys
    /// ([`idem::horizon`]), if at all: its setting when this store
    /// connected.
    pub fn remembers_expired(&self) -> Option<Duration> {
        self.inner.memory
    }

    /// Whether this store remembers expired keys (so the scripts that
    /// read or write a memory get it declared on a Cluster).
    pub(crate) fn remembers(&self) -> bool {
        self.inner.memory.is_some()
    }

    /// The memory the scripts are given for `id`: the namespace's, for a
    /// key of a remembered scope; `0` (none) otherwise.
    pub(crate) fn memory_arg(&self, id: &RecordId) -> Bytes {
        if idem::horizon::remembered_scope(id.scope().as_str()) {
            self.inner.memory_ms.clone()
        } else {
            Bytes::from_static(b"0")
        }
    }
}

/// The key of `namespace`'s setting: how long it remembers expired keys,
/// in milliseconds (`0` or none: not at all).
fn setting_key(namespace: &str) -> String {
    format!("{namespace}:remember_ms")
}

/// Writes `set` (if given; zero turns it off) as `namespace`'s memory of
/// expired keys, then reads the namespace's setting: the memory, and how
/// the scripts take it.
pub(crate) async fn settle_memory(
    conn: &Conn,
    namespace: &str,
    set: Option<Duration>,
) -> RedisResult<(Option<Duration>, Bytes)> {
    let key = setting_key(namespace);
    if let Some(memory) = set {
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(millis(memory).as_ref());
        conn.query_key(&cmd, &key).await?;
    }
    let mut cmd = redis::cmd("GET");
    cmd.arg(&key);
    let ms = match conn.query_key(&cmd, &key).await? {
        Value::Nil => 0,
        other => redis::from_redis_value::<u64>(other)?,
    };
    let memory = (ms > 0).then(|| Duration::from_millis(ms));
    let arg = memory.map_or(Bytes::from_static(b"0"), millis);
    Ok((memory, arg))
}
