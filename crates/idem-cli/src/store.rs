//! Opening a store from a URL.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use idem::{
    ClaimOutcome, ClaimParams, DeleteRecord, Failure, GetRecord, Lease, ListPage, ListQuery,
    ListRecords, MemoryStore, PurgeExpired, Record, RecordId, Resolution, Resolved, StepBegin,
    StepEntry, StepJournal, Store, StoreError, Timestamp,
};
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;

/// The store file used when no `--store` is given: `idem.db` in the
/// working directory.
pub const DEFAULT_STORE: &str = "sqlite:idem.db";

/// Where records live, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`: in this process only, gone when it exits.
    Memory,
    /// `sqlite:PATH` (or a bare path): the embedded durable store.
    Sqlite(PathBuf),
    /// `redis://…`, `rediss://…`, `redis+cluster://…`: a Redis server or
    /// Cluster (the URL as [`idem_redis`] reads it).
    Redis(String),
    /// `postgres://…`, `postgresql://…`: PostgreSQL (the URL as
    /// [`idem_postgres`] reads it; the tables are created on first use).
    Postgres(String),
}

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// A scheme whose store is not in this build yet.
    #[error(
        "store URL {url:?}: the {scheme} store is not available in this build yet \
         (available: memory:, sqlite:PATH, redis://, redis+cluster://, postgres://)"
    )]
    NotYet {
        /// The URL given.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// Not a store URL at all.
    #[error(
        "store URL {url:?} is not understood \
         (use memory:, sqlite:PATH, a file path, redis://, redis+cluster:// or postgres://)"
    )]
    Unknown {
        /// The URL given.
        url: String,
    },
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if url == "memory:" || url == "memory" {
            return Ok(StoreUrl::Memory);
        }
        if let Some(path) = url
            .strip_prefix("sqlite://")
            .or(url.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(StoreUrlError::Unknown {
                    url: url.to_owned(),
                });
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return match scheme {
                "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => {
                    Ok(StoreUrl::Redis(url.to_owned()))
                }
                "postgres" | "postgresql" => Ok(StoreUrl::Postgres(url.to_owned())),
                "dynamodb" => Err(StoreUrlError::NotYet {
                    url: url.to_owned(),
                    scheme: scheme.to_owned(),
                }),
                _ => Err(StoreUrlError::Unknown {
                    url: url.to_owned(),
                }),
            };
        }
        if url.is_empty() || url.contains(':') {
            return Err(StoreUrlError::Unknown {
                url: url.to_owned(),
            });
        }
        Ok(StoreUrl::Sqlite(PathBuf::from(url)))
    }
}

impl StoreUrl {
    /// Opens the store (connecting to it, for a networked one).
    pub async fn open(&self) -> anyhow::Result<AnyStore> {
        Ok(match self {
            StoreUrl::Memory => AnyStore::Memory(MemoryStore::new()),
            StoreUrl::Sqlite(path) => AnyStore::Sqlite(SqliteStore::open(path).map_err(|e| {
                anyhow::anyhow!("cannot open the store file {}: {e}", path.display())
            })?),
            StoreUrl::Redis(url) => AnyStore::Redis(RedisStore::connect(url).await?),
            StoreUrl::Postgres(url) => AnyStore::Postgres(PgStore::connect(url).await?),
        })
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Redis(url) => f.write_str(&idem_redis::redact_url(url)),
            StoreUrl::Postgres(url) => f.write_str(&idem_postgres::redact_url(url)),
        }
    }
}

/// Any store the binary can use, chosen at run time.
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// In memory.
    Memory(MemoryStore),
    /// The embedded file.
    Sqlite(SqliteStore),
    /// Redis or a Redis Cluster.
    Redis(RedisStore),
    /// PostgreSQL.
    Postgres(PgStore),
}

impl AnyStore {
    /// Starts purging expired records in the background (every 10 s, 1,000
    /// per transaction); stops when the handle is dropped.
    pub fn spawn_purger(&self) -> idem::PurgerHandle {
        idem::spawn_purger(self.clone(), Duration::from_secs(10), 1_000)
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Memory($s) => $e,
            AnyStore::Sqlite($s) => $e,
            AnyStore::Redis($s) => $e,
            AnyStore::Postgres($s) => $e,
        }
    };
}

impl Store for AnyStore {
    async fn peek(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        GetRecord::get(self, id).await
    }

    fn step_journal(&self) -> Option<std::sync::Arc<dyn idem::DynStepJournal>> {
        each!(self, s => s.step_journal())
    }

    fn local_now(&self) -> Option<idem::Timestamp> {
        each!(self, s => s.local_now())
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        each!(self, s => s.claim(id, params).await)
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        each!(self, s => s.complete(lease, response, retention).await)
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        each!(self, s => s.fail(lease, failure, retention).await)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        each!(self, s => s.extend(lease, duration).await)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        each!(self, s => s.release(lease).await)
    }

    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        each!(self, s => s.wait_for_change(id, timeout).await)
    }
}

impl GetRecord for AnyStore {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        each!(self, s => s.get(id).await)
    }
}

impl DeleteRecord for AnyStore {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        each!(self, s => s.delete(id).await)
    }
}

impl ListRecords for AnyStore {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        each!(self, s => s.list(query).await)
    }
}

impl StepJournal for AnyStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        each!(self, s => s.begin_step(lease, step).await)
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        each!(self, s => s.finish_step(lease, step, result).await)
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        each!(self, s => s.steps(id).await)
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        each!(self, s => s.resolve_step(id, step, resolution).await)
    }
}

impl PurgeExpired for AnyStore {
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        each!(self, s => s.purge_expired(limit).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!("memory:".parse::<StoreUrl>().ok(), Some(StoreUrl::Memory));
        assert_eq!(
            "sqlite:/tmp/x.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("/tmp/x.db".into()))
        );
        assert_eq!(
            "data/idem.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite("data/idem.db".into()))
        );
        assert_eq!(
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
                .parse::<StoreUrl>()
                .ok(),
            Some(StoreUrl::Redis(
                "redis+cluster://127.0.0.1:7000,127.0.0.1:7001".into()
            ))
        );
        assert_eq!(
            StoreUrl::Redis("redis://u:pw@h:1/0".into()).to_string(),
            "redis://u:***@h:1/0"
        );
        assert_eq!(
            "postgres://app:pw@127.0.0.1/test?schema=idem"
                .parse::<StoreUrl>()
                .map(|u| u.to_string())
                .ok()
                .as_deref(),
            Some("postgres://app:***@127.0.0.1/test?schema=idem")
        );
        let not_yet = "dynamodb://127.0.0.1/test"
            .parse::<StoreUrl>()
            .expect_err("not yet");
        assert!(
            not_yet.to_string().contains("not available in this build"),
            "{not_yet}"
        );
        let unknown = "ftp://x".parse::<StoreUrl>().expect_err("unknown");
        assert!(unknown.to_string().contains("not understood"), "{unknown}");
    }
}
