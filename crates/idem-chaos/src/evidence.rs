//! After a run: the ledger, the downstream or effects table and the
//! store's records, gathered and handed to the checker.

use std::collections::HashMap;
use std::path::Path;

use idem::{GetRecord, Key, ListQuery, ListRecords, Record, RecordId, Scope, StateKind};
use idem_dynamodb::{client_for, DynamoStore};
use idem_mysql::MySqlStore;
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use idem_testkit::servers::moto::{MotoServer, ACCESS_KEY, REGION, SECRET_KEY};

use crate::check::{self, Downstream, Tally, Violation};
use crate::error::{harness, ChaosError};
use crate::servers::{sqlite_file, Servers, TABLE};
use crate::worker::SCOPE;
use crate::Target;

/// Gathers the ledger, the downstream or effects table and the store's
/// records, and runs the checker over them.
pub(crate) async fn collect_evidence(
    target: Target,
    servers: &Servers,
    dir: &Path,
    keys: &[String],
    report: &mut Tally,
) -> Result<(), ChaosError> {
    let mut violations = Vec::new();
    match target {
        Target::PgInbox => {
            let effects =
                rows(&servers.psql("SELECT key, count(*) FROM chaos_effects GROUP BY key")?);
            let responded = rows(&servers.psql(&format!(
                "SELECT key, 1 FROM idem_inbox WHERE scope = '{SCOPE}' AND response IS NOT NULL"
            ))?);
            report.executions = effects.values().sum();
            for key in keys {
                let n = effects.get(key).copied().unwrap_or(0);
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                check::check_inbox_key(key, n, responded.contains_key(key), &mut violations);
            }
        }
        Target::PgLease
        | Target::RedisLease
        | Target::RedisClusterLease
        | Target::SqliteLease
        | Target::DynamoLease
        | Target::MySqlLease => {
            let mut text = String::new();
            for entry in std::fs::read_dir(dir).map_err(harness)? {
                let path = entry.map_err(harness)?.path();
                if path.extension().is_some_and(|e| e == "log") {
                    text.push_str(&std::fs::read_to_string(&path).map_err(harness)?);
                }
            }
            let (ledger, stale, lost) = check::parse_ledger(&text);
            report.stale_writes = stale;
            report.lease_lost = lost;
            report.executions = ledger.values().map(|k| k.starts.len() as u64).sum();
            let downstream: HashMap<String, Downstream> =
                rows(&servers.psql("SELECT key, fence FROM chaos_downstream")?)
                    .into_iter()
                    .map(|(k, fence)| (k, Downstream { fence }))
                    .collect();
            let (records, live) = match target {
                Target::PgLease => {
                    let store = PgStore::builder(&servers.pg_url())
                        .map_err(harness)?
                        .setup(false)
                        .connect()
                        .await
                        .map_err(harness)?;
                    read_records(&store, keys).await?
                }
                Target::MySqlLease => {
                    let url = servers.mysql_url(None).unwrap_or_default();
                    let store = MySqlStore::builder(&url)
                        .map_err(harness)?
                        .setup(false)
                        .connect()
                        .await
                        .map_err(harness)?;
                    read_records(&store, keys).await?
                }
                Target::SqliteLease => {
                    let store = SqliteStore::open(sqlite_file(dir)).map_err(harness)?;
                    read_records(&store, keys).await?
                }
                Target::DynamoLease => {
                    let url = servers.moto.as_ref().map(MotoServer::url);
                    let client = client_for(url.as_deref(), REGION, ACCESS_KEY, SECRET_KEY, None)
                        .map_err(harness)?;
                    read_records(&DynamoStore::new(client, TABLE), keys).await?
                }
                Target::RedisClusterLease => {
                    let store = RedisStore::connect(&servers.cluster_url(false))
                        .await
                        .map_err(harness)?;
                    read_records(&store, keys).await?
                }
                _ => {
                    let url = format!("redis://127.0.0.1:{}", servers.redis_port);
                    let store = RedisStore::connect(&url).await.map_err(harness)?;
                    read_records(&store, keys).await?
                }
            };
            for key in keys {
                check::check_lease_key(
                    key,
                    records.get(key),
                    ledger.get(key),
                    downstream.get(key).copied(),
                    &mut violations,
                );
            }
            if live > 0 {
                violations.push(Violation {
                    key: None,
                    what: format!("{live} records still in progress after the run settled"),
                });
            }
        }
        Target::HttpSqlite | Target::HttpRedis | Target::HttpPostgres => {}
    }
    report.violations.append(&mut violations);
    Ok(())
}

/// `key|number` lines from psql.
fn rows(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (key, n) = line.split_once('|')?;
            Some((key.to_owned(), n.trim().parse().ok()?))
        })
        .collect()
}

/// Every key's record, and how many records of the scope are in progress.
async fn read_records<S: GetRecord + ListRecords>(
    store: &S,
    keys: &[String],
) -> Result<(HashMap<String, Record>, usize), ChaosError> {
    let scope = Scope::new(SCOPE).map_err(harness)?;
    let mut records = HashMap::new();
    for key in keys {
        let id = RecordId::new(scope.clone(), Key::new(key).map_err(harness)?);
        if let Some(record) = store.get(&id).await.map_err(harness)? {
            records.insert(key.clone(), record);
        }
    }
    let mut query = ListQuery::new(1000);
    query.state = Some(StateKind::InProgress);
    query.scope = Some(scope);
    let page = store.list(&query).await.map_err(harness)?;
    Ok((records, page.records.len()))
}
