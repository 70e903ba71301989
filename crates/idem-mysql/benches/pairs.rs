//! Claim+complete pairs per second through `MySqlStore`, next to the
//! same SQL run by the raw driver in the same run: mysql_async, with the
//! same number of connections, sending the store's own claim call and
//! complete statement (prepared, as the store sends them). The ratio
//! column is idem pairs/s over driver pairs/s; the server's CPU per pair
//! is read from `/proc`. Then batched claims (`claim_many`, 100 per call)
//! against single claims, and the pairs of a store that remembers expired
//! keys (`?remember=30d`: a claim is a transaction of its own, the key's
//! record locked and the memory read) against one that does not.
//!
//! Run: `cargo bench -p idem-mysql --bench pairs [-- --secs N --rounds R]`
//!
//! It starts its own MariaDB (mariadb-install-db in a temporary directory,
//! default settings: `innodb_flush_log_at_trx_commit=1`, a log flush per
//! commit) on a free loopback port, so nothing else competes for it. The
//! first round of each point is a warm-up and is not reported.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::time::Duration;

use bytes::Bytes;
use idem::store::ClaimParams;
use idem::{ClaimMany, RecordId, Store};
use idem_mysql::MySqlStore;
use idem_testkit::bench::{count_arg, pair, rate, secs_arg};
use idem_testkit::servers::mysql::MySqlServer;
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Row, Value};

const CONNECTIONS: [usize; 3] = [1, 8, 32];
const BATCH: usize = 100;

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

async fn idem_pairs(store: &MySqlStore, callers: usize, secs: f64, round: usize) -> f64 {
    let s = store.clone();
    rate(callers, secs, move |c, i| {
        let s = s.clone();
        async move {
            let id = RecordId::parse("bench", &format!("p{round}-{c}-{i}")).expect("valid");
            pair(
                &s,
                &id,
                &params(),
                Bytes::from_static(b"{}"),
                Duration::from_secs(3600),
            )
            .await;
            1
        }
    })
    .await
}

/// The store's claim call and complete statement through mysql_async
/// alone: one claim (its row read) and one completion per pair.
async fn driver_pairs(
    pool: &Pool,
    store: &MySqlStore,
    callers: usize,
    secs: f64,
    round: usize,
) -> f64 {
    let (claim, complete) = (store.claim_sql(), store.complete_sql().to_owned());
    let pool = pool.clone();
    rate(callers, secs, move |c, i| {
        let (pool, complete) = (pool.clone(), complete.clone());
        async move {
            let key = format!("d{round}-{c}-{i}").into_bytes();
            let token = rand::random::<u128>().to_be_bytes().to_vec();
            let mut conn = pool.get_conn().await.expect("connection");
            let rows: Vec<Row> = conn
                .exec(
                    claim,
                    vec![
                        Value::from("bench"),
                        Value::Bytes(key.clone()),
                        Value::NULL,
                        Value::Bytes(token.clone()),
                        Value::Int(30_000),
                        Value::Int(3_600_000),
                    ],
                )
                .await
                .expect("claim");
            assert_eq!(rows.len(), 1, "one answer");
            conn.exec_drop(
                &complete,
                vec![
                    Value::from("{}"),
                    Value::Int(3_600_000),
                    Value::from("bench"),
                    Value::Bytes(key),
                    Value::Bytes(token),
                ],
            )
            .await
            .expect("complete");
            assert_eq!(conn.affected_rows(), 1, "completed");
            1
        }
    })
    .await
}

/// `(min, max)` of `values`, formatted.
fn range(values: &[f64]) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(0.0, f64::max);
    if values.len() > 1 {
        format!("{min:.0}–{max:.0}")
    } else {
        format!("{min:.0}")
    }
}

fn ratio_range(a: &[f64], b: &[f64]) -> String {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    let min = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ratios.iter().copied().fold(0.0, f64::max);
    format!("{min:.2}–{max:.2}")
}

#[tokio::main]
async fn main() {
    let secs = secs_arg(3.0);
    let rounds = count_arg("--rounds", 3);
    let server = MySqlServer::start().expect("start mariadb");
    let db = server.create_database("bench").expect("database");
    let url = server.url(&db);
    let truncate = || {
        server
            .admin(&db, "TRUNCATE idem_records")
            .expect("truncate");
    };
    println!("# idem-mysql pairs, {secs} s per point, {rounds} rounds after a warm-up\n");
    println!(
        "| connections | idem pairs/s | driver pairs/s (same SQL) | idem/driver | server CPU µs/pair, idem | server CPU µs/pair, driver |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for connections in CONNECTIONS {
        let store = MySqlStore::builder(&url)
            .expect("url")
            .pool_size(connections)
            .connect()
            .await
            .expect("connect");
        let opts =
            mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&url).expect("url"))
                .prefer_socket(false)
                .pool_opts(
                    mysql_async::PoolOpts::new()
                        .with_constraints(
                            mysql_async::PoolConstraints::new(0, connections).expect("constraints"),
                        )
                        .with_reset_connection(false),
                );
        let pool = Pool::new(opts);
        let (mut ours, mut theirs, mut cpu_ours, mut cpu_theirs) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..=rounds {
            // The order alternates, so neither side always runs second.
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for idem_first in order {
                truncate();
                let before = server.cpu();
                let rate = if idem_first {
                    idem_pairs(&store, connections, secs, round).await
                } else {
                    driver_pairs(&pool, &store, connections, secs, round).await
                };
                let cpu = (server.cpu() - before).as_secs_f64() * 1e6 / (rate * secs);
                if round == 0 {
                    continue;
                }
                if idem_first {
                    ours.push(rate);
                    cpu_ours.push(cpu);
                } else {
                    theirs.push(rate);
                    cpu_theirs.push(cpu);
                }
            }
        }
        println!(
            "| {connections} | {} | {} | {} | {} | {} |",
            range(&ours),
            range(&theirs),
            ratio_range(&ours, &theirs),
            range(&cpu_ours),
            range(&cpu_theirs),
        );
        pool.disconnect().await.expect("disconnect");
    }

    let store = MySqlStore::builder(&url)
        .expect("url")
        .pool_size(8)
        .connect()
        .await
        .expect("connect");
    truncate();
    let s = store.clone();
    let single = rate(8, secs, move |c, i| {
        let s = s.clone();
        async move {
            let id = RecordId::parse("bench", &format!("c{c}-{i}")).expect("valid");
            s.claim(&id, &params()).await.expect("claim");
            1
        }
    })
    .await;
    truncate();
    let s = store.clone();
    let batched = rate(8, secs, move |c, i| {
        let s = s.clone();
        async move {
            let claims: Vec<(RecordId, ClaimParams)> = (0..BATCH)
                .map(|j| {
                    let id = RecordId::parse("bench", &format!("b{c}-{i}-{j}")).expect("valid");
                    (id, params())
                })
                .collect();
            let results = s.claim_many(&claims).await.expect("batch");
            results.iter().filter(|r| r.is_ok()).count() as u64
        }
    })
    .await;
    println!("\n| connections | single claims/s | claim_many({BATCH}) claims/s | batched/single |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| 8 | {single:.0} | {batched:.0} | {:.1} |",
        batched / single
    );

    let remembering = MySqlStore::builder(&format!("{url}?remember=30d"))
        .expect("url")
        .pool_size(32)
        .connect()
        .await
        .expect("connect");
    // The setting is the database's: the other store has its own.
    let plain_db = server.create_database("bench").expect("database");
    let plain = MySqlStore::builder(&server.url(&plain_db))
        .expect("url")
        .pool_size(32)
        .connect()
        .await
        .expect("connect");
    assert_eq!(plain.remembers_expired(), None);
    println!("\n| connections | pairs/s, remembering | pairs/s, not | remembering/not |");
    println!("|---:|---:|---:|---:|");
    for connections in [8, 32] {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for round in 0..=rounds {
            for remember_first in [round % 2 == 0, round % 2 != 0] {
                let (store, db) = if remember_first {
                    (&remembering, &db)
                } else {
                    (&plain, &plain_db)
                };
                server.admin(db, "TRUNCATE idem_records").expect("truncate");
                let rate = idem_pairs(store, connections, secs, round + 100).await;
                if round > 0 {
                    if remember_first {
                        with.push(rate)
                    } else {
                        without.push(rate)
                    }
                }
            }
        }
        println!(
            "| {connections} | {} | {} | {} |",
            range(&with),
            range(&without),
            ratio_range(&with, &without),
        );
    }
}
