//! The transactional inbox's two layouts: what each costs a claim, and
//! what each clean-up costs the claims running beside it.
//!
//! 1. Claims: 8 callers, each a transaction of claim + set_response +
//!    commit on fresh keys, in the plain and the partitioned layout, next
//!    to `pgbench` running the same statements in the same transaction
//!    shape with 8 clients (the ratio is idem over pgbench).
//! 2. Clean-up of `--rows N` (default 500,000) expired rows while 8
//!    callers keep claiming: the plain layout's batched purge (5,000 rows
//!    a statement) followed by the `VACUUM` its deletes call for, against
//!    the partitioned layout's `maintain` (detach `CONCURRENTLY`, drop).
//!    For each: how long it took, and the claims' rate and p99 latency
//!    meanwhile, next to the same load with no clean-up running.
//!
//! Run: `cargo bench -p idem-postgres --bench cleanup [-- --secs N --rows N]`
//!
//! It starts its own PostgreSQL (initdb in a temporary directory, default
//! settings: fsync and synchronous_commit on) on a free loopback port.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, Pool};
use idem::RecordId;
use idem_postgres::inbox::{Inbox, InboxOutcome};
use idem_testkit::bench::{count_arg, secs_arg};
use idem_testkit::servers::postgres::{pgbench_command, PgServer};
use tokio_postgres::NoTls;

const CALLERS: usize = 8;
const HOUR: Duration = Duration::from_secs(3600);
const PURGE_BATCH: usize = 5000;

/// The claims the load made, and their latencies in microseconds.
struct Load {
    claims: u64,
    latencies: Vec<u64>,
    elapsed: Duration,
}

impl Load {
    fn rate(&self) -> f64 {
        self.claims as f64 / self.elapsed.as_secs_f64()
    }

    fn p99_ms(&mut self) -> f64 {
        self.latencies.sort_unstable();
        let i = (self.latencies.len() * 99 / 100).min(self.latencies.len().saturating_sub(1));
        self.latencies.get(i).copied().unwrap_or(0) as f64 / 1000.0
    }
}

/// One claim transaction on a fresh key: claim, respond, commit.
async fn claim_once(pool: &Pool, inbox: &Inbox, tag: &str, n: u64) {
    let mut client = pool.get().await.expect("pooled connection");
    let tx = client.transaction().await.expect("begin");
    let id = RecordId::parse("bench", &format!("{tag}-{n}")).expect("valid");
    assert_eq!(
        inbox.claim(&tx, &id, None).await.expect("claim"),
        InboxOutcome::New
    );
    inbox.set_response(&tx, &id, b"ok").await.expect("respond");
    tx.commit().await.expect("commit");
}

/// Runs `CALLERS` claimers for `secs`, and on until `during` (if any)
/// finishes.
async fn load<F: std::future::Future<Output = ()>>(
    pool: &Pool,
    inbox: &Inbox,
    tag: &str,
    secs: f64,
    during: Option<F>,
) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (pool, inbox, tag) = (pool.clone(), inbox.clone(), tag.to_owned());
            let (stop, next) = (stop.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let t = Instant::now();
                    claim_once(&pool, &inbox, &tag, n).await;
                    latencies.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                }
                latencies
            })
        })
        .collect();
    let pause = tokio::time::sleep(Duration::from_secs_f64(secs));
    match during {
        Some(work) => {
            tokio::join!(work, pause);
        }
        None => pause.await,
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("claimer"));
    }
    Load {
        claims: latencies.len() as u64,
        latencies,
        elapsed,
    }
}

/// pgbench running one claim transaction of `layout` as the inbox does.
fn pgbench_claims(server: &PgServer, schema: &str, partitioned: bool, secs: f64) -> f64 {
    let render = |sql: &str| sql.replace("{schema}", schema);
    let key = "('p' || :client_id::text || '-' || :n::text)";
    let claim = [
        ("$1", "'bench'"),
        ("$2", key),
        ("$3", "NULL::bytea"),
        ("$4", "3600000"),
    ];
    let respond = [("$1", "'bench'"), ("$2", key), ("$3", "'\\x6f6b'::bytea")];
    let statements: &[(&str, &[(&str, &str)])] = if partitioned {
        &[
            (include_str!("../sql/inbox_p_lock.sql"), &claim[..2]),
            (include_str!("../sql/inbox_p_claim.sql"), &claim),
            (include_str!("../sql/inbox_p_respond.sql"), &respond),
        ]
    } else {
        &[
            (include_str!("../sql/inbox_claim.sql"), &claim),
            (include_str!("../sql/inbox_respond.sql"), &respond),
        ]
    };
    let mut script = String::from("\\set n random(1, 1000000000000)\nBEGIN;\n");
    for (sql, params) in statements {
        script.push_str(&pgbench_command(&render(sql), params));
    }
    script.push_str("COMMIT;\n");
    server.pgbench(&script, CALLERS, secs).expect("run pgbench")
}

#[tokio::main]
async fn main() {
    let secs = secs_arg(5.0);
    let rows = count_arg("--rows", 500_000);
    let server = PgServer::start().expect("start postgres");
    let url = server.url("postgres");
    let config: tokio_postgres::Config = url.parse().expect("url");
    let pool = Pool::builder(Manager::new(config, NoTls))
        .max_size(CALLERS + 2)
        .build()
        .expect("pool");
    let admin = pool.get().await.expect("connection");
    let plain = Inbox::in_schema("plain", HOUR);
    let part = Inbox::in_schema("part", HOUR).partitioned(HOUR);
    {
        let mut setup = pool.get().await.expect("connection");
        plain.setup(&mut setup).await.expect("setup plain");
        part.setup(&mut setup).await.expect("setup partitioned");
    }
    let psql = |sql: &str| server.psql("postgres", sql).expect("psql");

    println!("# idem-postgres inbox layouts, {secs} s per point, {CALLERS} callers\n");
    println!("| layout | idem claim tx/s | pgbench tx/s (same SQL) | ratio |");
    println!("|---|---:|---:|---:|");
    for (name, inbox, schema, partitioned) in [
        ("plain", &plain, "plain", false),
        ("partitioned", &part, "part", true),
    ] {
        let idem = load(&pool, inbox, "warm", secs, None::<std::future::Ready<()>>)
            .await
            .rate();
        let ceiling = pgbench_claims(&server, schema, partitioned, secs);
        println!(
            "| {name} | {idem:.0} | {ceiling:.0} | {:.2} |",
            idem / ceiling
        );
    }

    // Expired rows to clean up: in the plain table, and in a partition of
    // three days ago (named as maintain names its own partitions).
    psql(&format!(
        "INSERT INTO plain.idem_inbox
         SELECT 'old', 'k' || g, NULL, 'x', now() - interval '3 days', now() - interval '2 days'
         FROM generate_series(1, {rows}) g"
    ));
    let width = HOUR.as_secs();
    let start = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        / width
        - 72)
        * width;
    psql(&format!(
        "CREATE TABLE part.idem_inbox_p_{width}_{start} PARTITION OF part.idem_inbox_p
             FOR VALUES FROM (to_timestamp({start})) TO (to_timestamp({end}));
         INSERT INTO part.idem_inbox_p
         SELECT 'old', 'k' || g, NULL, 'x', to_timestamp({start}), to_timestamp({start}) + interval '1 hour'
         FROM generate_series(1, {rows}) g",
        end = start + width
    ));
    psql("VACUUM ANALYZE");
    psql("CHECKPOINT");

    let mut quiet = load(&pool, &plain, "quiet", secs, None::<std::future::Ready<()>>).await;
    let purged = Arc::new(AtomicU64::new(0));
    let purge_time = Arc::new(parking_lot::Mutex::new((Duration::ZERO, Duration::ZERO)));
    let mut during_purge = {
        let (purged, purge_time, admin, purger) =
            (purged.clone(), purge_time.clone(), &admin, plain.clone());
        let cleanup = async move {
            let t = Instant::now();
            loop {
                let n = purger
                    .purge_expired(admin, PURGE_BATCH)
                    .await
                    .expect("purge");
                purged.fetch_add(n, Ordering::Relaxed);
                if n < PURGE_BATCH as u64 {
                    break;
                }
            }
            let deleting = t.elapsed();
            admin
                .batch_execute("VACUUM plain.idem_inbox")
                .await
                .expect("vacuum");
            *purge_time.lock() = (deleting, t.elapsed() - deleting);
        };
        load(&pool, &plain, "purge", secs, Some(cleanup)).await
    };
    assert_eq!(
        purged.load(Ordering::Relaxed),
        rows as u64,
        "every expired row purged"
    );
    let (deleting, vacuum) = *purge_time.lock();

    let dropped = Arc::new(parking_lot::Mutex::new((Vec::new(), Duration::ZERO)));
    let mut during_drop = {
        let (dropped, admin, maintainer) = (dropped.clone(), &admin, part.clone());
        let cleanup = async move {
            let t = Instant::now();
            let done = maintainer.maintain(admin).await.expect("maintain");
            *dropped.lock() = (done.dropped, t.elapsed());
        };
        load(&pool, &part, "drop", secs, Some(cleanup)).await
    };
    let (names, drop_time) = dropped.lock().clone();
    assert_eq!(names.len(), 1, "the old partition is dropped: {names:?}");

    println!(
        "\n| clean-up of {rows} expired rows | time s | claims/s meanwhile | p99 ms meanwhile |"
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| none (the same load alone, plain) | - | {:.0} | {:.1} |",
        quiet.rate(),
        quiet.p99_ms()
    );
    println!(
        "| plain: purge_expired({PURGE_BATCH}) until done | {:.2} | {:.0} | {:.1} |",
        deleting.as_secs_f64(),
        during_purge.rate(),
        during_purge.p99_ms()
    );
    println!(
        "| plain: then VACUUM | {:.2} | (in the row above) | |",
        vacuum.as_secs_f64()
    );
    println!(
        "| partitioned: maintain (detach concurrently, drop) | {:.2} | {:.0} | {:.1} |",
        drop_time.as_secs_f64(),
        during_drop.rate(),
        during_drop.p99_ms()
    );
    println!(
        "\npurge: {:.0} rows/s; drop: {:.0} rows/s",
        rows as f64 / (deleting + vacuum).as_secs_f64(),
        rows as f64 / drop_time.as_secs_f64()
    );
}
