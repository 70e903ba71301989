//! The short fault-injection run of the test suite: every target, every
//! fault kind, worker processes against the real store (started here as
//! child processes), and the checker over ledger, downstream and store.
//! `scripts/chaos` runs the long version.

use std::time::Duration;

use idem_chaos::{Fault, Plan, Report, Target};

async fn short_run(target: Target) -> Report {
    let plan = Plan {
        seed: 11,
        duration: Duration::from_secs(7),
        fault_every: Duration::from_millis(250),
        ..Plan::new(target, env!("CARGO_BIN_EXE_idem-chaos"))
    };
    let report = idem_chaos::run(&plan, |_| {})
        .await
        .expect("the run itself works");
    eprint!("{}", Report::tables(std::slice::from_ref(&report)));
    assert!(
        report.violations().is_empty(),
        "violations:\n{}",
        report.violation_lines(50)
    );
    for kind in target.faults() {
        assert!(
            report.faults_of(kind) >= 1,
            "no {} fault was injected: {:?}",
            kind.name(),
            report.faults
        );
    }
    assert_eq!(
        report.count("acked"),
        report.count("deliv"),
        "every delivery is acknowledged once"
    );
    assert!(report.count("dups") > 0 && report.count("redeliv") > 0);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_inbox_commits_exactly_one_effect_per_key_under_faults() {
    let report = short_run(Target::PgInbox).await;
    assert_eq!(
        report.count("exec"),
        report.keys() as u64,
        "one effect per key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_completes_every_key_once_under_faults() {
    let report = short_run(Target::PgLease).await;
    assert!(report.count("exec") >= report.keys() as u64);
}

/// PostgreSQL under lock and statement timeout pressure alone: idem's
/// table held locked against writes again and again while the workers'
/// sessions give up on a lock after 100 ms. Every key still completes
/// once (a completion refused as final would leave its record failed:
/// a violation), and the inbox commits one effect per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lock_and_statement_timeouts_end_no_run_that_took_effect() {
    for target in [Target::PgLease, Target::PgInbox] {
        let plan = Plan {
            seed: 3,
            keys: 400,
            duration: Duration::from_secs(6),
            fault_every: Duration::from_millis(400),
            faults: vec![Fault::Locks],
            ..Plan::new(target, env!("CARGO_BIN_EXE_idem-chaos"))
        };
        let report = idem_chaos::run(&plan, |_| {})
            .await
            .expect("the run itself works");
        eprint!("{}", Report::tables(std::slice::from_ref(&report)));
        assert!(
            report.violations().is_empty(),
            "{}: violations:\n{}",
            target.name(),
            report.violation_lines(50)
        );
        assert!(report.faults_of(Fault::Locks) >= 5, "{:?}", report.faults);
        assert_eq!(
            report.count("acked"),
            report.count("deliv"),
            "every delivery is acknowledged once"
        );
        if target == Target::PgInbox {
            assert_eq!(
                report.count("exec"),
                report.keys() as u64,
                "one effect per key"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_completes_every_key_once_under_faults() {
    let report = short_run(Target::RedisLease).await;
    assert!(report.count("exec") >= report.keys() as u64);
}

/// A Redis Cluster with a replica per master, failed over and resharded
/// under load, writes waiting for the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_lease_completes_every_key_once_through_failovers_and_migrations() {
    let report = short_run(Target::RedisClusterLease).await;
    assert!(report.count("exec") >= report.keys() as u64);
}

/// Worker processes sharing one SQLite file, all SIGKILLed at once as the
/// store's crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_lease_completes_every_key_once_under_faults() {
    let report = short_run(Target::SqliteLease).await;
    assert!(report.count("exec") >= report.keys() as u64);
}

/// DynamoDB (moto), each worker's clock skewed from the others' and
/// jumping: fencing holds whatever the clocks say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_lease_completes_every_key_once_under_faults_and_skewed_clocks() {
    let report = short_run(Target::DynamoLease).await;
    assert!(report.count("exec") >= report.keys() as u64);
}

/// MariaDB SIGKILLed and restarted (crash recovery) among the other
/// faults: leases decided by the server's clock, fences from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_lease_completes_every_key_once_under_faults() {
    let report = short_run(Target::MySqlLease).await;
    assert!(report.count("exec") >= report.keys() as u64);
}

/// The checker can fail: a Redis without an append-only file loses every
/// record when it restarts, so keys completed before a restart run again
/// and their second completion is acknowledged too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forgets_is_caught() {
    let plan = Plan {
        seed: 5,
        keys: 200,
        duplicates: 0.6,
        duration: Duration::from_secs(6),
        fault_every: Duration::from_millis(1200),
        faults: vec![Fault::StoreRestart],
        redis_append_only: false,
        ..Plan::new(Target::RedisLease, env!("CARGO_BIN_EXE_idem-chaos"))
    };
    let report = idem_chaos::run(&plan, |_| {})
        .await
        .expect("the run itself works");
    assert!(report.faults_of(Fault::StoreRestart) >= 2);
    assert!(
        report
            .violations()
            .iter()
            .any(|v| v.what.contains("completions were acknowledged")),
        "a restart that loses acknowledged completions must be reported: {:?}",
        report.violations()
    );
    discard(report.kept());
}

/// Removes what a run that had to find violations kept for a look.
fn discard(kept: Option<&std::path::Path>) {
    if let Some(dir) = kept {
        std::fs::remove_dir_all(dir).expect("remove the kept ledgers");
    }
}

async fn short_http_run(target: Target) -> Report {
    short_http_run_with(target, Vec::new()).await
}

async fn short_http_run_with(target: Target, gateway_args: Vec<String>) -> Report {
    let plan = Plan {
        seed: 11,
        duration: Duration::from_secs(7),
        fault_every: Duration::from_millis(250),
        gateway_args,
        ..Plan::new(target, env!("CARGO_BIN_EXE_idem-chaos"))
    };
    let report = idem_chaos::run(&plan, |_| {})
        .await
        .expect("the run itself works");
    eprint!("{}", Report::tables(std::slice::from_ref(&report)));
    assert!(
        report.violations().is_empty(),
        "violations:\n{}",
        report.violation_lines(50)
    );
    for kind in target.faults() {
        assert!(
            report.faults_of(kind) >= 1,
            "no {} fault was injected: {:?}",
            kind.name(),
            report.faults
        );
    }
    assert!(
        report.count("timeouts") > 0,
        "some clients timed out mid-request"
    );
    assert!(report.count("exec") <= report.keys() as u64);
    assert!(
        report.count("2xx") > report.keys() as u64,
        "duplicates got replays"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_on_sqlite_executes_each_key_at_most_once_under_faults() {
    short_http_run(Target::HttpSqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_on_redis_executes_each_key_at_most_once_under_faults() {
    short_http_run(Target::HttpRedis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_on_postgres_executes_each_key_at_most_once_under_faults() {
    short_http_run(Target::HttpPostgres).await;
}

/// With `--reconcile`, the keys the faults leave with an unknown outcome
/// (gateways killed mid-request, answers lost) are settled by asking the
/// upstream, still with every key executed at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_with_a_reconciler_settles_the_keys_it_would_leave_unknown() {
    let report = short_http_run_with(
        Target::HttpSqlite,
        vec!["--reconcile={upstream}/reconcile".into()],
    )
    .await;
    assert!(
        report.count("unknown") * 50 <= report.keys() as u64,
        "at most 2 % of the keys left unknown (a sixth without), not {}",
        report.count("unknown")
    );
}

/// The HTTP checker can fail: a gateway told to forward takeovers sends a
/// killed gateway's requests to the upstream again, and the upstream's
/// ledger shows keys executed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_sends_requests_again_is_caught() {
    let plan = Plan {
        seed: 3,
        keys: 200,
        duration: Duration::from_secs(6),
        fault_every: Duration::from_millis(500),
        faults: vec![Fault::Kill],
        gateway_args: vec!["--forward-takeovers".into(), "true".into()],
        ..Plan::new(Target::HttpSqlite, env!("CARGO_BIN_EXE_idem-chaos"))
    };
    let report = idem_chaos::run(&plan, |_| {})
        .await
        .expect("the run itself works");
    assert!(report.faults_of(Fault::Kill) >= 2);
    assert!(
        report
            .violations()
            .iter()
            .any(|v| v.what.contains("the upstream executed it 2 times")),
        "a key sent to the upstream twice must be reported: {:?}",
        report.violations()
    );
    discard(report.kept());
}
