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
    /// `dynamodb://TABLE[?endpoint=URL][&region=R][&create=true]`: a
    /// DynamoDB table (the binary's `dynamodb` feature). Credentials come
    /// from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`), the region from `region=` or `AWS_REGION`;
    /// `endpoint=` names a DynamoDB-compatible server (DynamoDB Local,
    /// moto); `create=true` creates the table if it is missing.
    DynamoDb(DynamoUrl),
}

/// A `dynamodb://` store URL, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoUrl {
    /// The table.
    pub table: String,
    /// A DynamoDB-compatible endpoint, if not AWS's own.
    pub endpoint: Option<String>,
    /// The region, if not from the environment.
    pub region: Option<String>,
    /// Create the table if it is missing.
    pub create: bool,
}

impl DynamoUrl {
    fn parse(url: &str, rest: &str) -> Result<Self, StoreUrlError> {
        let bad = |why: String| StoreUrlError::Invalid {
            url: url.to_owned(),
            why,
        };
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        let table = table.trim_end_matches('/');
        // DynamoDB's rule for table names.
        if !(3..=255).contains(&table.len())
            || !table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            return Err(bad(format!(
                "the table name {table:?} must be 3 to 255 characters of A-Z a-z 0-9 _ . -"
            )));
        }
        let mut parsed = DynamoUrl {
            table: table.to_owned(),
            endpoint: None,
            region: None,
            create: false,
        };
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "endpoint" => parsed.endpoint = Some(value.into_owned()),
                "region" => parsed.region = Some(value.into_owned()),
                "create" => {
                    parsed.create = value
                        .parse()
                        .map_err(|_| bad(format!("create={value} is not true or false")))?
                }
                other => {
                    return Err(bad(format!(
                        "unknown parameter {other:?} (endpoint, region and create are taken)"
                    )))
                }
            }
        }
        Ok(parsed)
    }
}

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// A scheme whose store is not in this build.
    #[error(
        "store URL {url:?}: the {scheme} store is not in this build \
         (build with `cargo install idem-cli --features {scheme}`)"
    )]
    NotYet {
        /// The URL given.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// A URL of a known scheme with something wrong in it.
    #[error("store URL {url:?}: {why}")]
    Invalid {
        /// The URL given.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// Not a store URL at all.
    #[error(
        "store URL {url:?} is not understood \
         (use memory:, sqlite:PATH, a file path, redis://, redis+cluster://, postgres:// \
         or dynamodb://)"
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
                "dynamodb" if cfg!(feature = "dynamodb") => Ok(StoreUrl::DynamoDb(
                    DynamoUrl::parse(url, &url["dynamodb://".len()..])?,
                )),
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
            StoreUrl::DynamoDb(url) => open_dynamodb(url).await?,
        })
    }
}

#[cfg(feature = "dynamodb")]
async fn open_dynamodb(url: &DynamoUrl) -> anyhow::Result<AnyStore> {
    let client = match &url.region {
        Some(region) => {
            let var = |name: &str| {
                std::env::var(name)
                    .map_err(|_| anyhow::anyhow!("environment variable {name} is not set"))
            };
            idem_dynamodb::client_for(
                url.endpoint.as_deref(),
                region,
                &var("AWS_ACCESS_KEY_ID")?,
                &var("AWS_SECRET_ACCESS_KEY")?,
                std::env::var("AWS_SESSION_TOKEN").ok(),
            )?
        }
        None => idem_dynamodb::client_from_env(url.endpoint.as_deref())?,
    };
    if url.create {
        idem_dynamodb::create_table(&client, &url.table)
            .await
            .map_err(|e| anyhow::anyhow!("cannot create the table {}: {e}", url.table))?;
    }
    Ok(AnyStore::DynamoDb(idem_dynamodb::DynamoStore::new(
        client,
        url.table.clone(),
    )))
}

#[cfg(not(feature = "dynamodb"))]
async fn open_dynamodb(_: &DynamoUrl) -> anyhow::Result<AnyStore> {
    anyhow::bail!("the dynamodb store is not in this build (--features dynamodb)")
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Redis(url) => f.write_str(&idem_redis::redact_url(url)),
            StoreUrl::Postgres(url) => f.write_str(&idem_postgres::redact_url(url)),
            StoreUrl::DynamoDb(url) => write!(f, "dynamodb://{}", url.table),
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
    /// DynamoDB.
    #[cfg(feature = "dynamodb")]
    DynamoDb(idem_dynamodb::DynamoStore),
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
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb($s) => $e,
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
        if cfg!(feature = "dynamodb") {
            assert_eq!(
                "dynamodb://idem_records?endpoint=http://127.0.0.1:5000&create=true"
                    .parse::<StoreUrl>()
                    .ok(),
                Some(StoreUrl::DynamoDb(DynamoUrl {
                    table: "idem_records".into(),
                    endpoint: Some("http://127.0.0.1:5000".into()),
                    region: None,
                    create: true,
                }))
            );
            for (url, needle) in [
                ("dynamodb://ab", "3 to 255"),
                ("dynamodb://t%20x", "3 to 255"),
                ("dynamodb://table?create=yes", "not true or false"),
                ("dynamodb://table?port=1", "unknown parameter"),
            ] {
                let error = url.parse::<StoreUrl>().expect_err(url).to_string();
                assert!(error.contains(needle), "{url}: {error}");
            }
        } else {
            let not_yet = "dynamodb://idem_records"
                .parse::<StoreUrl>()
                .expect_err("not in this build");
            assert!(
                not_yet.to_string().contains("--features dynamodb"),
                "{not_yet}"
            );
        }
        let unknown = "ftp://x".parse::<StoreUrl>().expect_err("unknown");
        assert!(unknown.to_string().contains("not understood"), "{unknown}");
    }
}
