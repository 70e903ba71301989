//! Store URLs: what each scheme names, and opening it.

use std::path::PathBuf;
use std::time::Duration;

use idem::MemoryStore;
use idem_mysql::MySqlStore;
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_remote::RemoteStore;
use idem_sqlite::SqliteStore;

use super::AnyStore;

/// The store used when none is named: the file `idem.db` in the working
/// directory.
pub const DEFAULT_STORE: &str = "sqlite:idem.db";

/// Where records live, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`: in this process only, gone when it exits.
    /// `memory:?remember=30d` remembers expired keys ([`idem::horizon`]).
    Memory {
        /// How long expired keys are remembered (zero or `None`: not at
        /// all).
        remember: Option<Duration>,
    },
    /// `sqlite:PATH` (or a bare path): the embedded durable store.
    /// `sqlite:PATH?remember=30d` remembers expired keys
    /// ([`idem::horizon`]).
    Sqlite {
        /// The file.
        path: PathBuf,
        /// How long expired keys are remembered (zero: not at all);
        /// `None` keeps what the file says.
        remember: Option<Duration>,
    },
    /// `redis://…`, `rediss://…`, `redis+cluster://…`: a Redis server or
    /// Cluster (the URL as [`idem_redis`] reads it).
    Redis(String),
    /// `postgres://…`, `postgresql://…`: PostgreSQL (the URL as
    /// [`idem_postgres`] reads it; the tables are created on first use).
    Postgres(String),
    /// `mysql://…`, `mariadb://…`: MySQL or MariaDB (the URL as
    /// [`idem_mysql`] reads it; the tables are created on first use).
    MySql(String),
    /// `dynamodb://TABLE[?endpoint=URL][&region=R][&create=true]`: a
    /// DynamoDB table (the `dynamodb` feature; the URL as
    /// `idem_dynamodb::DynamoStore::connect` reads it).
    DynamoDb(String),
    /// `http://…`, `https://…`: a remote `idem serve` (its claim API, as
    /// [`idem_remote`] reads the URL), authenticated with the token given
    /// to [`StoreUrl::open_with`].
    Remote(String),
}

/// Why a store URL was refused.
#[derive(Debug, thiserror::Error)]
pub enum StoreUrlError {
    /// A scheme whose store is not in this build.
    #[error(
        "store URL {url:?}: the {scheme} store is not in this build \
         (build with the `{scheme}` feature)"
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
         (use memory:, sqlite:PATH, a file path, redis://, redis+cluster://, postgres://, \
         mysql://, dynamodb:// or http(s):// for a remote idem serve)"
    )]
    Unknown {
        /// The URL given.
        url: String,
    },
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreUrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        let (local, remember) = remembering(url)?;
        if local == "memory:" || local == "memory" {
            return Ok(StoreUrl::Memory { remember });
        }
        if let Some(path) = local
            .strip_prefix("sqlite://")
            .or(local.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(StoreUrlError::Unknown {
                    url: url.to_owned(),
                });
            }
            return Ok(StoreUrl::Sqlite {
                path: PathBuf::from(path),
                remember,
            });
        }
        if let Some((scheme, _)) = url.split_once("://") {
            return match scheme {
                "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => {
                    Ok(StoreUrl::Redis(url.to_owned()))
                }
                "postgres" | "postgresql" => Ok(StoreUrl::Postgres(url.to_owned())),
                "mysql" | "mariadb" => {
                    check_mysql(url)?;
                    Ok(StoreUrl::MySql(url.to_owned()))
                }
                "http" | "https" => Ok(StoreUrl::Remote(url.to_owned())),
                "dynamodb" if cfg!(feature = "dynamodb") => {
                    check_dynamodb(url)?;
                    Ok(StoreUrl::DynamoDb(url.to_owned()))
                }
                "dynamodb" => Err(StoreUrlError::NotYet {
                    url: url.to_owned(),
                    scheme: scheme.to_owned(),
                }),
                _ => Err(StoreUrlError::Unknown {
                    url: url.to_owned(),
                }),
            };
        }
        if local.is_empty() || local.contains(':') {
            return Err(StoreUrlError::Unknown {
                url: url.to_owned(),
            });
        }
        Ok(StoreUrl::Sqlite {
            path: PathBuf::from(local),
            remember,
        })
    }
}

/// A local store's URL split from its `?remember=DURATION` (the only
/// parameter a local store takes); other URLs are given back whole.
fn remembering(url: &str) -> Result<(&str, Option<Duration>), StoreUrlError> {
    let local = url.starts_with("memory") || url.starts_with("sqlite:") || !url.contains("://");
    let Some((base, query)) = url.split_once('?').filter(|_| local) else {
        return Ok((url, None));
    };
    let invalid = |why: String| StoreUrlError::Invalid {
        url: url.to_owned(),
        why,
    };
    match query.split_once('=') {
        Some(("remember", value)) => {
            let memory =
                idem::url::parse_duration(value).map_err(|e| invalid(format!("remember: {e}")))?;
            Ok((base, Some(memory)))
        }
        _ => Err(invalid(format!(
            "{query:?}: a local store takes only remember=DURATION (how long expired keys are \
             remembered, e.g. remember=30d)"
        ))),
    }
}

/// Why a store named by a valid URL could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The store file could not be opened or created.
    #[error("cannot open the store file {path}")]
    File {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: idem_sqlite::OpenError,
    },
    /// The networked store refused the connection or its settings (the
    /// cause names the address).
    #[error("cannot open the {store} store")]
    Connect {
        /// Which store: Redis, PostgreSQL, MySQL, DynamoDB, a remote idem
        /// serve.
        store: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreUrl {
    /// Opens the store (connecting to it, for a networked one), with no
    /// token for a remote `idem serve`.
    pub async fn open(&self) -> Result<AnyStore, OpenError> {
        self.open_with(None).await
    }

    /// Opens the store, sending `token` (as `Authorization: Bearer`) to a
    /// remote `idem serve`; other stores ignore it.
    pub async fn open_with(&self, token: Option<&str>) -> Result<AnyStore, OpenError> {
        let store = match self {
            StoreUrl::Redis(_) => "Redis",
            StoreUrl::Postgres(_) => "PostgreSQL",
            StoreUrl::MySql(_) => "MySQL",
            StoreUrl::DynamoDb(_) => "DynamoDB",
            _ => "remote idem serve",
        };
        let connect =
            |source: Box<dyn std::error::Error + Send + Sync>| OpenError::Connect { store, source };
        Ok(match self {
            StoreUrl::Memory { remember } => {
                let builder = MemoryStore::builder();
                AnyStore::Memory(match remember {
                    Some(memory) => builder.remember_expired(*memory).build(),
                    None => builder.build(),
                })
            }
            StoreUrl::Sqlite { path, remember } => {
                let mut builder = SqliteStore::builder(path);
                if let Some(memory) = remember {
                    builder = builder.remember_expired(*memory);
                }
                AnyStore::Sqlite(builder.open().map_err(|source| OpenError::File {
                    path: path.display().to_string(),
                    source,
                })?)
            }
            StoreUrl::Redis(url) => AnyStore::Redis(
                RedisStore::connect(url)
                    .await
                    .map_err(|e| connect(e.into()))?,
            ),
            StoreUrl::Postgres(url) => {
                AnyStore::Postgres(PgStore::connect(url).await.map_err(|e| connect(e.into()))?)
            }
            StoreUrl::MySql(url) => AnyStore::MySql(
                MySqlStore::connect(url)
                    .await
                    .map_err(|e| connect(e.into()))?,
            ),
            StoreUrl::DynamoDb(url) => open_dynamodb(url).await.map_err(connect)?,
            StoreUrl::Remote(url) => {
                let mut builder = RemoteStore::builder(url).map_err(|e| connect(e.into()))?;
                if let Some(token) = token {
                    builder = builder.token(token);
                }
                AnyStore::Remote(builder.build().map_err(|e| connect(e.into()))?)
            }
        })
    }
}

/// Refuses a `mysql://` URL the store would refuse, when it is read.
fn check_mysql(url: &str) -> Result<(), StoreUrlError> {
    match MySqlStore::builder(url) {
        Ok(_) => Ok(()),
        Err(idem_mysql::ConnectError::InvalidUrl { reason, .. }) => Err(StoreUrlError::Invalid {
            url: idem_mysql::redact_url(url),
            why: reason,
        }),
        Err(other) => Err(StoreUrlError::Invalid {
            url: idem_mysql::redact_url(url),
            why: other.to_string(),
        }),
    }
}

/// Refuses a `dynamodb://` URL the store would refuse, when it is read.
#[cfg(feature = "dynamodb")]
fn check_dynamodb(url: &str) -> Result<(), StoreUrlError> {
    match idem_dynamodb::DynamoStore::builder(url) {
        Ok(_) => Ok(()),
        Err(idem_dynamodb::ConnectError::InvalidUrl { reason, .. }) => {
            Err(StoreUrlError::Invalid {
                url: url.to_owned(),
                why: reason,
            })
        }
        Err(other) => Err(StoreUrlError::Invalid {
            url: url.to_owned(),
            why: other.to_string(),
        }),
    }
}

#[cfg(not(feature = "dynamodb"))]
fn check_dynamodb(_: &str) -> Result<(), StoreUrlError> {
    Ok(())
}

#[cfg(feature = "dynamodb")]
async fn open_dynamodb(url: &str) -> Result<AnyStore, Box<dyn std::error::Error + Send + Sync>> {
    Ok(AnyStore::DynamoDb(
        idem_dynamodb::DynamoStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "dynamodb"))]
async fn open_dynamodb(_: &str) -> Result<AnyStore, Box<dyn std::error::Error + Send + Sync>> {
    Err("the dynamodb store is not in this build (the `dynamodb` feature)".into())
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::Memory { remember } => {
                f.write_str("memory:")?;
                write_remember(f, *remember)
            }
            StoreUrl::Sqlite { path, remember } => {
                write!(f, "sqlite:{}", path.display())?;
                write_remember(f, *remember)
            }
            StoreUrl::Redis(url) => f.write_str(&idem_redis::redact_url(url)),
            StoreUrl::Postgres(url) => f.write_str(&idem_postgres::redact_url(url)),
            StoreUrl::MySql(url) => f.write_str(&idem_mysql::redact_url(url)),
            // The table only: the query names an endpoint, not worth a log line.
            StoreUrl::DynamoDb(url) => {
                f.write_str(url.split_once('?').map_or(url, |(table, _)| table))
            }
            StoreUrl::Remote(url) => f.write_str(url),
        }
    }
}

/// Whether `url`'s query names `param`.
fn has_param(url: &str, param: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|pair| pair.split_once('=').map_or(pair, |(name, _)| name) == param)
    })
}

/// `url` with `remember=` for `memory` added to its parameters.
fn with_remember(url: &str, memory: Duration) -> String {
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}remember={}s", memory.as_secs())
}

/// `?remember=…` for a local store that remembers expired keys.
fn write_remember(f: &mut std::fmt::Formatter<'_>, remember: Option<Duration>) -> std::fmt::Result {
    match remember {
        Some(memory) => write!(f, "?remember={}s", memory.as_secs()),
        None => Ok(()),
    }
}

impl StoreUrl {
    /// Whether the store this URL names can remember expired keys
    /// ([`idem::horizon`]): the local ones, PostgreSQL, MySQL, DynamoDB
    /// and Redis.
    pub fn can_remember(&self) -> bool {
        self.remembers_unless_told() || matches!(self, StoreUrl::Redis(_))
    }

    /// Whether the gateway turns the memory on when not told: for the
    /// stores that keep it on disk (the local ones, PostgreSQL, MySQL and
    /// DynamoDB), not for Redis, which keeps it in memory (about 200 bytes
    /// a key for the whole memory) and remembers when asked.
    pub fn remembers_unless_told(&self) -> bool {
        matches!(
            self,
            StoreUrl::Memory { .. }
                | StoreUrl::Sqlite { .. }
                | StoreUrl::Postgres(_)
                | StoreUrl::MySql(_)
                | StoreUrl::DynamoDb(_)
        )
    }

    /// This URL, remembering expired keys for `memory` unless it says
    /// how long itself (and if its store can).
    pub fn remembering_by_default(self, memory: Duration) -> Self {
        match self {
            StoreUrl::Memory { remember: None } => StoreUrl::Memory {
                remember: Some(memory),
            },
            StoreUrl::Sqlite {
                path,
                remember: None,
            } => StoreUrl::Sqlite {
                path,
                remember: Some(memory),
            },
            StoreUrl::Postgres(url) if !has_param(&url, "remember") => {
                StoreUrl::Postgres(with_remember(&url, memory))
            }
            StoreUrl::MySql(url) if !has_param(&url, "remember") => {
                StoreUrl::MySql(with_remember(&url, memory))
            }
            StoreUrl::Redis(url) if !has_param(&url, "remember") => {
                StoreUrl::Redis(with_remember(&url, memory))
            }
            StoreUrl::DynamoDb(url) if !has_param(&url, "remember") => {
                StoreUrl::DynamoDb(with_remember(&url, memory))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_stores_remember_by_default_unless_their_url_says() {
        let day = Duration::from_secs(86_400);
        let url = |s: &str| s.parse::<StoreUrl>().expect(s);
        assert_eq!(
            url("mysql://root@127.0.0.1/app").remembering_by_default(day),
            StoreUrl::MySql("mysql://root@127.0.0.1/app?remember=86400s".into())
        );
        assert_eq!(
            url("postgres://127.0.0.1/app?pool_size=4").remembering_by_default(day),
            StoreUrl::Postgres("postgres://127.0.0.1/app?pool_size=4&remember=86400s".into())
        );
        let own = url("mysql://root@127.0.0.1/app?remember=0s");
        assert_eq!(own.clone().remembering_by_default(day), own);
        assert!(url("mysql://root@127.0.0.1/app").can_remember());
        assert_eq!(
            url("redis+cluster://127.0.0.1:7000").remembering_by_default(day),
            StoreUrl::Redis("redis+cluster://127.0.0.1:7000?remember=86400s".into())
        );
        // Without the feature a `dynamodb://` URL is refused as not built in.
        #[cfg(feature = "dynamodb")]
        assert_eq!(
            url("dynamodb://idem_records?region=eu-west-1").remembering_by_default(day),
            StoreUrl::DynamoDb("dynamodb://idem_records?region=eu-west-1&remember=86400s".into())
        );
        let redis = url("redis://127.0.0.1");
        assert!(redis.can_remember() && !redis.remembers_unless_told());
        assert!(!url("http://127.0.0.1:8080").can_remember());
    }

    #[test]
    fn urls() {
        let sqlite = |path: &str, remember: Option<u64>| StoreUrl::Sqlite {
            path: path.into(),
            remember: remember.map(Duration::from_secs),
        };
        assert_eq!(
            "memory:".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Memory { remember: None })
        );
        assert_eq!(
            "sqlite:/tmp/x.db".parse::<StoreUrl>().ok(),
            Some(sqlite("/tmp/x.db", None))
        );
        assert_eq!(
            "data/idem.db".parse::<StoreUrl>().ok(),
            Some(sqlite("data/idem.db", None))
        );
        assert_eq!(
            "sqlite:/tmp/x.db?remember=30d".parse::<StoreUrl>().ok(),
            Some(sqlite("/tmp/x.db", Some(30 * 86_400)))
        );
        assert_eq!(
            "idem.db?remember=0s".parse::<StoreUrl>().ok(),
            Some(sqlite("idem.db", Some(0)))
        );
        assert_eq!(
            "memory:?remember=1h".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Memory {
                remember: Some(Duration::from_secs(3600))
            })
        );
        assert_eq!(
            sqlite("a.db", Some(60)).to_string(),
            "sqlite:a.db?remember=60s"
        );
        for bad in ["idem.db?remember=soon", "idem.db?mode=ro", "memory:?x"] {
            let error = bad.parse::<StoreUrl>().expect_err(bad).to_string();
            assert!(error.contains("remember"), "{bad}: {error}");
        }
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
        assert_eq!(
            "mysql://app:pw@127.0.0.1:3306/orders?pool_size=4"
                .parse::<StoreUrl>()
                .map(|u| u.to_string())
                .ok()
                .as_deref(),
            Some("mysql://app:***@127.0.0.1:3306/orders?pool_size=4")
        );
        for (url, needle) in [
            ("mysql://app:pw@127.0.0.1:3306", "no database"),
            ("mariadb://app:pw@h/db?ssl-mode=PREFERRED", "PREFERRED"),
        ] {
            let error = url.parse::<StoreUrl>().expect_err(url).to_string();
            assert!(error.contains(needle), "{url}: {error}");
            assert!(!error.contains(":pw@"), "{url}: {error}");
        }
        if cfg!(feature = "dynamodb") {
            assert_eq!(
                "dynamodb://idem_records?endpoint=http://127.0.0.1:5000&create=true"
                    .parse::<StoreUrl>()
                    .ok(),
                Some(StoreUrl::DynamoDb(
                    "dynamodb://idem_records?endpoint=http://127.0.0.1:5000&create=true".into()
                ))
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
                not_yet.to_string().contains("`dynamodb` feature"),
                "{not_yet}"
            );
        }
        let unknown = "ftp://x".parse::<StoreUrl>().expect_err("unknown");
        assert!(unknown.to_string().contains("not understood"), "{unknown}");
    }
}
