//! What announcing a record's end to waiting duplicates costs the writes
//! that end records, measured with `pgbench` running the store's own claim
//! and complete statements (one pair per transaction) on three schemas of
//! one server, in alternating rounds:
//!
//! - **as shipped**: the trigger of `migrations/0006_waiters.sql`, whose
//!   `WHEN` clause lets only records somebody waits on through (none here);
//! - **no trigger**: the same schema with the triggers dropped, the floor;
//! - **announce every end**: a trigger without that condition, so every
//!   complete sends a NOTIFY (what the design avoids: a NOTIFY holds a
//!   server-wide lock from its commit until the commit's WAL is flushed).
//!
//! Run: `cargo bench -p idem-postgres --bench announce [-- --secs N]`
//!
//! It starts its own PostgreSQL (initdb in a temporary directory, default
//! settings: fsync and synchronous_commit on) on a free loopback port.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

mod script;

use idem_postgres::PgStore;
use idem_testkit::bench::secs_arg;
use idem_testkit::servers::postgres::PgServer;

const CLIENTS: usize = 8;
const ROUNDS: usize = 3;

/// The schemas, and the SQL that turns a migrated schema into each.
const VARIANTS: [(&str, &str); 3] = [
    ("shipped", ""),
    (
        "untriggered",
        "DROP TRIGGER idem_records_ended ON untriggered.idem_records;
         DROP TRIGGER idem_records_deleted ON untriggered.idem_records;",
    ),
    (
        "always",
        "DROP TRIGGER idem_records_ended ON always.idem_records;
         CREATE TRIGGER idem_records_ended AFTER UPDATE ON always.idem_records
             FOR EACH ROW WHEN (NEW.state <> 'in_progress')
             EXECUTE FUNCTION always.idem_announce_end();",
    ),
];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs = secs_arg(5.0);
    let server = PgServer::start().expect("start postgres");
    let mut stores = Vec::new();
    for (schema, change) in VARIANTS {
        let url = format!("{}?schema={schema}", server.url("postgres"));
        let store = PgStore::connect(&url).await.expect("connect");
        if !change.is_empty() {
            server.psql("postgres", change).expect("change the trigger");
        }
        stores.push(store);
    }
    println!("# announcing ends: claim+complete pairs/s, pgbench, {CLIENTS} clients, {secs} s per point\n");
    println!("| round | as shipped | no trigger | announce every end | shipped / none | every end / none |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for round in 1..=ROUNDS {
        let mut tps = Vec::new();
        for (store, (schema, _)) in stores.iter().zip(VARIANTS) {
            server
                .psql(
                    "postgres",
                    &format!("TRUNCATE {schema}.idem_records, {schema}.idem_steps; CHECKPOINT"),
                )
                .expect("truncate");
            tps.push(
                server
                    .pgbench(&script::run(store, 0), CLIENTS, secs)
                    .expect("run pgbench"),
            );
        }
        println!(
            "| {round} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
            tps[0],
            tps[1],
            tps[2],
            tps[0] / tps[1],
            tps[2] / tps[1]
        );
    }
}
