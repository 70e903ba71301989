//! What journaled steps and durable inputs cost on PostgreSQL: runs per
//! second through the executor with 0 and 3 steps, and through a durable
//! handler with 3 steps (its input journaled too), next to `pgbench`
//! running the same statements (the store's own claim, step and complete
//! SQL, prepared) with the same client count in the same run. One pgbench
//! transaction is one run, so the ratio column is idem runs/s over
//! pgbench tps.
//!
//! Run: `cargo bench -p idem-postgres --bench steps [-- --secs N]`
//!
//! It starts its own PostgreSQL (initdb in a temporary directory, default
//! settings: fsync and synchronous_commit on) on a free loopback port.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

mod script;

use std::convert::Infallible;

use idem::step::{Retry, StepError};
use idem::{Idempotency, Key, RecordId, Scope};
use idem_postgres::PgStore;
use idem_testkit::bench::{rate, secs_arg};
use idem_testkit::servers::postgres::PgServer;

const CALLERS: usize = 8;
const STEPS: usize = 3;

/// Runs per second through `run`, each with `steps` journaled steps.
async fn runs(idem: &Idempotency<PgStore>, steps: usize, secs: f64) -> f64 {
    let idem = idem.clone();
    rate(CALLERS, secs, move |c, i| {
        let idem = idem.clone();
        async move {
            let id = RecordId::parse("bench", &format!("r{steps}-{c}-{i}")).expect("valid");
            idem.run(&id, None, |ctx| async move {
                for step in 0..steps {
                    ctx.step(&format!("s{step}"), Retry, |_| async {
                        Ok::<_, Infallible>(1u8)
                    })
                    .await?;
                }
                Ok::<_, StepError<Infallible>>(())
            })
            .await
            .expect("run");
            1
        }
    })
    .await
}

/// Runs per second through a durable handler with `STEPS` steps.
async fn durable_runs(idem: &Idempotency<PgStore>, secs: f64) -> f64 {
    let durable = idem
        .durable(
            Scope::new("bench").expect("valid"),
            |n: u64, ctx| async move {
                for step in 0..STEPS {
                    ctx.step(&format!("s{step}"), Retry, |_| async {
                        Ok::<_, Infallible>(1u8)
                    })
                    .await?;
                }
                Ok::<_, StepError<Infallible>>(n)
            },
        )
        .expect("journal");
    rate(CALLERS, secs, move |c, i| {
        let durable = durable.clone();
        async move {
            let key = Key::new(&format!("d-{c}-{i}")).expect("valid");
            durable.run(&key, i).await.expect("run");
            1
        }
    })
    .await
}

#[tokio::main]
async fn main() {
    let secs = secs_arg(3.0);
    let server = PgServer::start().expect("start postgres");
    let url = format!("{}?schema=bench", server.url("postgres"));
    let store = PgStore::builder(&url)
        .expect("url")
        .pool_size(CALLERS)
        .connect()
        .await
        .expect("connect");
    let idem = Idempotency::builder(store.clone()).build().expect("config");
    let truncate = || {
        server
            .psql(
                "postgres",
                "TRUNCATE bench.idem_records, bench.idem_steps; CHECKPOINT",
            )
            .expect("truncate");
    };
    let measure = |steps: usize| -> f64 {
        truncate();
        server
            .pgbench(&script::run(&store, steps), CALLERS, secs)
            .expect("run pgbench")
    };
    let raw_plain = measure(0);
    let raw_steps = measure(STEPS);
    let raw_durable = measure(STEPS + 1);
    truncate();
    let plain = runs(&idem, 0, secs).await;
    truncate();
    let stepped = runs(&idem, STEPS, secs).await;
    truncate();
    let durable = durable_runs(&idem, secs).await;

    println!("# idem-postgres steps, {CALLERS} callers, {secs} s per point\n");
    println!("| work | statements per run | idem runs/s | pgbench runs/s (same SQL) | ratio | vs 0 steps |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (work, statements, idem_rate, raw) in [
        ("run, 0 steps", 2, plain, raw_plain),
        ("run, 3 steps", 2 + 2 * STEPS, stepped, raw_steps),
        (
            "durable run, 3 steps",
            2 + 2 * (STEPS + 1),
            durable,
            raw_durable,
        ),
    ] {
        println!(
            "| {work} | {statements} | {idem_rate:.0} | {raw:.0} | {:.2} | {:.2} |",
            idem_rate / raw,
            idem_rate / plain
        );
    }
}
