//! The servers of a run, started as child processes on loopback:
//! PostgreSQL (the downstream table, and the store of the PostgreSQL
//! targets), Redis, moto for DynamoDB; and where each target's workers
//! find their store.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_dynamodb::{client_for, create_table};
use idem_postgres::PgStore;
use idem_testkit::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};
use idem_testkit::postgres::PgServer;
use idem_testkit::redis::RedisServer;
use idem_testkit::{free_port, ServerError};

use crate::error::{harness, ChaosError};
use crate::Target;

/// The servers of a run: PostgreSQL always (the downstream table lives
/// there), Redis for the Redis target, moto for DynamoDB.
pub(crate) struct Servers {
    target: Target,
    pg: Arc<Mutex<PgServer>>,
    pg_port: u16,
    db: String,
    redis: Option<Arc<Mutex<RedisServer>>>,
    pub(crate) redis_port: u16,
    pub(crate) moto: Option<MotoServer>,
}

/// The DynamoDB table of a run.
pub(crate) const TABLE: &str = "idem-chaos";

impl Servers {
    pub(crate) async fn start(target: Target, append_only: bool) -> Result<Self, ChaosError> {
        let server = |source| ChaosError::Server {
            what: "PostgreSQL",
            source,
        };
        let (pg, db) = tokio::task::spawn_blocking(move || {
            let pg = PgServer::start()?;
            let db = pg.create_database("chaos")?;
            let tables = if target == Target::PgInbox {
                "CREATE TABLE chaos_effects (id bigserial PRIMARY KEY, key text NOT NULL, \
                 pid bigint NOT NULL)"
            } else {
                "CREATE TABLE chaos_downstream (key text PRIMARY KEY, fence bigint NOT NULL, \
                 pid bigint NOT NULL, writes int NOT NULL)"
            };
            pg.psql(&db, tables)?;
            Ok((pg, db))
        })
        .await
        .map_err(harness)?
        .map_err(server)?;
        let pg_port = pg.port();
        let (redis, redis_port) = if target == Target::RedisLease {
            let redis = tokio::task::spawn_blocking(move || {
                // Acknowledged writes must survive a crash of the server.
                let durable: &[&str] = if append_only {
                    &["--appendonly", "yes", "--appendfsync", "always"]
                } else {
                    &[]
                };
                RedisServer::start_with(free_port()?, durable)
            })
            .await
            .map_err(harness)?
            .map_err(|source| ChaosError::Server {
                what: "Redis",
                source,
            })?;
            let port = redis.port();
            (Some(Arc::new(Mutex::new(redis))), port)
        } else {
            (None, 0)
        };
        let moto = if target == Target::DynamoLease {
            let moto = tokio::task::spawn_blocking(MotoServer::start_serial)
                .await
                .map_err(harness)?
                .map_err(|source| ChaosError::Server {
                    what: "moto (DynamoDB)",
                    source,
                })?;
            let client = client_for(Some(&moto.url()), REGION, ACCESS_KEY, SECRET_KEY, None)
                .map_err(harness)?;
            create_table(&client, TABLE)
                .await
                .map_err(|e| harness(format!("creating the DynamoDB table: {e}")))?;
            Some(moto)
        } else {
            None
        };
        let servers = Self {
            target,
            pg: Arc::new(Mutex::new(pg)),
            pg_port,
            db,
            redis,
            redis_port,
            moto,
        };
        if target.on_postgres() {
            // Applies the store's and the inbox's migrations.
            PgStore::connect(&servers.pg_url())
                .await
                .map_err(|e| harness(format!("setting up the PostgreSQL store: {e}")))?;
        }
        Ok(servers)
    }

    pub(crate) fn pg_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.pg_port, self.db)
    }

    /// What the fault proxy stands in front of: the store's server, or
    /// for SQLite, which has none, the downstream database.
    pub(crate) fn proxied_addr(&self) -> std::net::SocketAddr {
        let port = match (&self.moto, self.target) {
            (Some(moto), _) => moto.port(),
            (None, Target::RedisLease) => self.redis_port,
            (None, _) => self.pg_port,
        };
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// The store's and the downstream database's URLs for the workers,
    /// with the fault proxy on `port` and the run's files in `dir`.
    pub(crate) fn worker_urls(&self, port: u16, dir: &Path) -> (String, String) {
        let proxied_pg = format!("postgres://postgres@127.0.0.1:{port}/{}", self.db);
        match self.target {
            Target::RedisLease => (format!("redis://127.0.0.1:{port}"), self.pg_url()),
            Target::SqliteLease => (sqlite_file(dir).to_string_lossy().into_owned(), proxied_pg),
            Target::DynamoLease => (format!("http://127.0.0.1:{port}#{TABLE}"), self.pg_url()),
            _ => (proxied_pg, self.pg_url()),
        }
    }

    /// Crashes the store, leaves it down for `down`, and starts it again.
    pub(crate) fn restart_store(
        &self,
        down: Duration,
    ) -> tokio::task::JoinHandle<Result<(), ServerError>> {
        let (pg, redis) = (Arc::clone(&self.pg), self.redis.clone());
        tokio::task::spawn_blocking(move || match redis {
            Some(redis) => {
                let mut redis = redis.lock().unwrap_or_else(PoisonError::into_inner);
                redis.stop();
                std::thread::sleep(down);
                redis.start_again()
            }
            None => {
                let mut pg = pg.lock().unwrap_or_else(PoisonError::into_inner);
                pg.crash();
                std::thread::sleep(down);
                pg.start_again()
            }
        })
    }

    pub(crate) fn psql(&self, sql: &str) -> Result<String, ChaosError> {
        self.pg
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .psql(&self.db, sql)
            .map_err(|source| ChaosError::Server {
                what: "PostgreSQL",
                source,
            })
    }
}

/// The SQLite store file of a run whose files are in `dir`.
pub(crate) fn sqlite_file(dir: &Path) -> PathBuf {
    dir.join("idem.db")
}
