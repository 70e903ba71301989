//! The servers of a run, started as child processes on loopback:
//! PostgreSQL (the downstream table, and the store of the PostgreSQL
//! targets), Redis or a Redis Cluster, MariaDB, moto for DynamoDB; the fault
//! proxies in front of them; and where each target's workers find their
//! store.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_dynamodb::{client_for, create_table};
use idem_mysql::MySqlStore;
use idem_postgres::PgStore;
use idem_testkit::doubles::proxy::FaultProxy;
use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};
use idem_testkit::servers::mysql::MySqlServer;
use idem_testkit::servers::postgres::PgServer;
use idem_testkit::servers::redis::{ClusterSpec, RedisCluster, RedisServer};
use idem_testkit::{free_port, ServerError};

use crate::error::{harness, ChaosError};
use crate::Target;

/// The servers of a run: PostgreSQL always (the downstream table lives
/// there), Redis or a Redis Cluster for the Redis targets, moto for
/// DynamoDB; and the fault proxies between them and the workers.
pub(crate) struct Servers {
    target: Target,
    pg: Arc<Mutex<PgServer>>,
    pg_port: u16,
    db: String,
    redis: Option<Arc<Mutex<RedisServer>>>,
    pub(crate) redis_port: u16,
    cluster: Option<Arc<Mutex<RedisCluster>>>,
    pub(crate) moto: Option<MotoServer>,
    /// MariaDB and its database, for the MySQL target.
    mysql: Option<(Arc<Mutex<MySqlServer>>, String)>,
    /// One proxy in front of the store (of each Cluster node), or for
    /// SQLite, which has no server, of the downstream database.
    pub(crate) proxies: Vec<FaultProxy>,
    replica_acks: bool,
}

/// How long a Cluster write waits for its replica (below the workers'
/// response timeout).
const REPLICA_TIMEOUT: &str = "400ms";

/// The workers' PostgreSQL session settings (URL-encoded `options`): a
/// lock waited on for 100 ms, or a statement running for 250 ms, is given
/// up with SQLSTATE 55P03 or 57014.
const PG_TIMEOUTS: &str = "-c%20lock_timeout%3D100ms%20-c%20statement_timeout%3D250ms";

/// The DynamoDB table of a run.
pub(crate) const TABLE: &str = "idem-chaos";

impl Servers {
    pub(crate) async fn start(
        target: Target,
        append_only: bool,
        replica_acks: bool,
    ) -> Result<Self, ChaosError> {
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
        let mysql = if target == Target::MySqlLease {
            let (server, db) = tokio::task::spawn_blocking(|| {
                let server = MySqlServer::start()?;
                let db = server.create_database("chaos")?;
                Ok((server, db))
            })
            .await
            .map_err(harness)?
            .map_err(|source| ChaosError::Server {
                what: "MariaDB",
                source,
            })?;
            Some((Arc::new(Mutex::new(server)), db))
        } else {
            None
        };
        let (cluster, proxies) = if target == Target::RedisClusterLease {
            let (cluster, proxies) = start_cluster().await?;
            (Some(Arc::new(Mutex::new(cluster))), proxies)
        } else {
            let mysql_port = mysql
                .as_ref()
                .map(|(server, _)| server.lock().unwrap_or_else(PoisonError::into_inner).port());
            let port = match (&moto, target) {
                (Some(moto), _) => moto.port(),
                (None, Target::MySqlLease) => mysql_port.unwrap_or(0),
                (None, Target::RedisLease) => redis_port,
                (None, _) => pg_port,
            };
            (None, vec![start_proxy(port).await?])
        };
        let servers = Self {
            target,
            pg: Arc::new(Mutex::new(pg)),
            pg_port,
            db,
            redis,
            redis_port,
            cluster,
            moto,
            mysql,
            proxies,
            replica_acks,
        };
        if let Some(url) = servers.mysql_url(None) {
            // Applies the store's migrations.
            MySqlStore::connect(&url)
                .await
                .map_err(|e| harness(format!("setting up the MySQL store: {e}")))?;
        }
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

    /// The MySQL store's URL, to `port` (the server's own if `None`).
    pub(crate) fn mysql_url(&self, port: Option<u16>) -> Option<String> {
        let (server, db) = self.mysql.as_ref()?;
        let port =
            port.unwrap_or_else(|| server.lock().unwrap_or_else(PoisonError::into_inner).port());
        Some(format!("mysql://root@127.0.0.1:{port}/{db}"))
    }

    /// The store's and the downstream database's URLs for the workers,
    /// through the fault proxies, with the run's files in `dir`.
    pub(crate) fn worker_urls(&self, dir: &Path) -> (String, String) {
        let port = self.proxies.first().map_or(0, |p| p.addr().port());
        let proxied_pg = format!("postgres://postgres@127.0.0.1:{port}/{}", self.db);
        match self.target {
            Target::RedisLease => (format!("redis://127.0.0.1:{port}"), self.pg_url()),
            Target::RedisClusterLease => (self.cluster_url(self.replica_acks), self.pg_url()),
            Target::SqliteLease => (sqlite_file(dir).to_string_lossy().into_owned(), proxied_pg),
            Target::DynamoLease => (format!("http://127.0.0.1:{port}#{TABLE}"), self.pg_url()),
            Target::MySqlLease => (
                self.mysql_url(Some(port)).unwrap_or_default(),
                self.pg_url(),
            ),
            // The sessions give up on locks and statements soon, as a
            // deployment with timeouts set does; `locks` faults meet them.
            Target::PgLease | Target::PgInbox => {
                (format!("{proxied_pg}?options={PG_TIMEOUTS}"), self.pg_url())
            }
            _ => (proxied_pg, self.pg_url()),
        }
    }

    /// Locks idem's table on PostgreSQL (the inbox's for the inbox mode)
    /// against writes for `hold`, from a session of its own; errors (the
    /// server restarting meanwhile) end it early.
    pub(crate) fn hold_locks(
        &self,
        hold: Duration,
    ) -> tokio::task::JoinHandle<Result<(), ServerError>> {
        let (url, table) = (
            self.pg_url(),
            if self.target == Target::PgInbox {
                "idem_inbox"
            } else {
                "idem_records"
            },
        );
        tokio::spawn(async move {
            let Ok((client, connection)) =
                tokio_postgres::connect(&url, tokio_postgres::NoTls).await
            else {
                return Ok(());
            };
            let connection = tokio::spawn(connection);
            let locked = client
                .batch_execute(&format!(
                    "BEGIN; LOCK TABLE public.{table} IN EXCLUSIVE MODE"
                ))
                .await;
            if locked.is_ok() {
                tokio::time::sleep(hold).await;
                let _ = client.batch_execute("COMMIT").await;
            }
            drop(client);
            let _ = connection.await;
            Ok(())
        })
    }

    /// The Cluster's URL (through the proxies), its writes waiting for a
    /// replica if `acks`.
    pub(crate) fn cluster_url(&self, acks: bool) -> String {
        let hosts: Vec<String> = self.proxies.iter().map(|p| p.addr().to_string()).collect();
        let acks = if acks {
            format!("?replicas=1&replica_timeout={REPLICA_TIMEOUT}")
        } else {
            String::new()
        };
        format!("redis+cluster://{}{acks}", hosts.join(","))
    }

    /// Crashes the store, leaves it down for `down`, and starts it again.
    pub(crate) fn restart_store(
        &self,
        down: Duration,
    ) -> tokio::task::JoinHandle<Result<(), ServerError>> {
        let (pg, redis, cluster) = (
            Arc::clone(&self.pg),
            self.redis.clone(),
            self.cluster.clone(),
        );
        if let Some((mysql, _)) = &self.mysql {
            let mysql = Arc::clone(mysql);
            return tokio::task::spawn_blocking(move || {
                let mut mysql = mysql.lock().unwrap_or_else(PoisonError::into_inner);
                mysql.crash();
                std::thread::sleep(down);
                mysql.start_again()
            });
        }
        let pick = rand::random::<u64>();
        tokio::task::spawn_blocking(move || match (redis, cluster) {
            (_, Some(cluster)) => {
                let mut cluster = cluster.lock().unwrap_or_else(PoisonError::into_inner);
                let masters = cluster.masters()?;
                let master = masters[pick as usize % masters.len()];
                let promoted = cluster.fail_over(master)?;
                std::thread::sleep(down);
                cluster.replace(master, promoted)
            }
            (Some(redis), None) => {
                let mut redis = redis.lock().unwrap_or_else(PoisonError::into_inner);
                redis.stop();
                std::thread::sleep(down);
                redis.start_again()
            }
            (None, None) => {
                let mut pg = pg.lock().unwrap_or_else(PoisonError::into_inner);
                pg.crash();
                std::thread::sleep(down);
                pg.start_again()
            }
        })
    }

    /// Moves `slots` slots from one Cluster master to another, picked at
    /// random by `pick`.
    pub(crate) fn migrate(
        &self,
        slots: usize,
        pick: usize,
    ) -> Option<tokio::task::JoinHandle<Result<(), ServerError>>> {
        let cluster = self.cluster.clone()?;
        Some(tokio::task::spawn_blocking(move || {
            let cluster = cluster.lock().unwrap_or_else(PoisonError::into_inner);
            let masters = cluster.masters()?;
            let from = masters[pick % masters.len()];
            let to = masters[(pick / masters.len() + 1 + pick % masters.len()) % masters.len()];
            if from != to {
                cluster.move_slots(from, to, slots)?;
            }
            Ok(())
        }))
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

/// A fault proxy in front of the loopback `port`.
async fn start_proxy(port: u16) -> Result<FaultProxy, ChaosError> {
    FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .map_err(|source| ChaosError::Server {
            what: "fault proxy",
            source,
        })
}

/// A Cluster of three masters with a replica each, every node behind a
/// fault proxy whose port it announces (clients, redirections and
/// replication all go through the proxies; the Cluster bus does not).
async fn start_cluster() -> Result<(RedisCluster, Vec<FaultProxy>), ChaosError> {
    let server = |source| ChaosError::Server {
        what: "Redis Cluster",
        source,
    };
    let ports = tokio::task::spawn_blocking(|| RedisCluster::free_ports(6))
        .await
        .map_err(harness)?
        .map_err(server)?;
    let mut proxies = Vec::new();
    for port in &ports {
        proxies.push(start_proxy(*port).await?);
    }
    let announce = proxies.iter().map(|p| p.addr().port()).collect();
    let cluster = tokio::task::spawn_blocking(move || {
        RedisCluster::start_with(ClusterSpec {
            replicas: 1,
            ports,
            announce,
            extra: Vec::new(),
        })
    })
    .await
    .map_err(harness)?
    .map_err(server)?;
    Ok((cluster, proxies))
}

/// The SQLite store file of a run whose files are in `dir`.
pub(crate) fn sqlite_file(dir: &Path) -> PathBuf {
    dir.join("idem.db")
}
