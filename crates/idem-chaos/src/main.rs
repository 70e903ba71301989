//! `idem-chaos`: fault-injection runs against real stores, with a checker.
//!
//! ```text
//! idem-chaos run [--target pg-inbox|pg-lease|redis-lease|redis-cluster-lease|sqlite-lease|dynamodb-lease|mysql-lease|http-sqlite|http-redis|http-postgres|all]
//!                [--seed N] [--keys N]
//!                [--duplicates SHARE] [--workers K] [--duration 60s] [--fault-every 300ms]
//!                [--faults kill,stop,restart,latency,blackhole,reset,cut,clock,migrate]
//!                [--no-replica-acks]
//! ```
//!
//! It prints a summary table (one for the worker targets, one for the
//! HTTP targets: the engine's [`Report::tables`]) and exits with status 1 if any run found a violation.
//! `idem-chaos worker`, `http-client` and `gateway` are the modes the runs
//! start their processes in; they are not meant to be run by hand.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use idem_chaos::{Fault, Plan, Report, Target};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "idem-chaos",
    about = "Fault-injection runs for idem, with a checker"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs the workload under faults against each target and checks it.
    Run(RunArgs),
    /// Worker mode, started by `run` (reads deliveries on stdin).
    #[command(hide = true)]
    Worker,
    /// HTTP client mode, started by `run` (reads requests on stdin).
    #[command(hide = true)]
    HttpClient,
    /// Gateway mode, started by `run`: the `idem` binary's own command
    /// line (`gateway proxy --listen …`).
    #[command(hide = true)]
    Gateway {
        /// The `idem` arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// A flag given twice takes its last value, so `scripts/chaos` can pass
/// its defaults first and the caller's flags after them.
#[derive(clap::Args)]
#[command(args_override_self = true)]
struct RunArgs {
    /// pg-inbox, pg-lease, redis-lease, redis-cluster-lease, sqlite-lease,
    /// dynamodb-lease, mysql-lease, http-sqlite, http-redis, http-postgres, or all.
    #[arg(long, default_value = "all")]
    target: String,
    /// Seeds the workload and the faults.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct keys (default: 100 for each second of `--duration`, 50 on
    /// dynamodb-lease).
    #[arg(long)]
    keys: Option<usize>,
    /// The share of deliveries that are duplicates (0 to 0.95).
    #[arg(long, default_value_t = 0.33)]
    duplicates: f64,
    /// Worker processes (HTTP targets: client processes).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Deliveries each worker works on at once (default: 8; 64 on the
    /// HTTP targets, whose clients wait on each request).
    #[arg(long)]
    inflight: Option<usize>,
    /// The executor's lease.
    #[arg(long, default_value = "1s", value_parser = idem::url::parse_duration)]
    lease: Duration,
    /// How long deliveries are published and faults injected.
    #[arg(long, default_value = "8s", value_parser = idem::url::parse_duration)]
    duration: Duration,
    /// The mean time between faults.
    #[arg(long, default_value = "400ms", value_parser = idem::url::parse_duration)]
    fault_every: Duration,
    /// Which faults, comma-separated (default: every kind that reaches
    /// the target).
    #[arg(long, value_delimiter = ',')]
    faults: Vec<String>,
    /// Redis Cluster: writes do not wait for a replica (measures what
    /// failovers lose without it).
    #[arg(long)]
    no_replica_acks: bool,
    /// More `idem proxy` arguments for the gateways of the HTTP targets,
    /// one per flag (`--gateway-arg=--keyring=/path/keys`); `{upstream}`
    /// stands for the upstream's URL
    /// (`--gateway-arg=--reconcile={upstream}/reconcile`).
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    gateway_args: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem-chaos: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Cmd::Worker => runtime.block_on(idem_chaos::worker::main()).map(|()| true),
        Cmd::HttpClient => runtime
            .block_on(idem_chaos::http::client::main())
            .map(|()| true),
        Cmd::Gateway { args } => {
            idem_cli::Cli::try_parse_from(std::iter::once("idem".to_owned()).chain(args))
                .map_err(anyhow::Error::from)
                .and_then(|cli| {
                    // Logged as the `idem` binary logs (IDEM_LOG), to the
                    // run directory's gateway-N.err.
                    idem_cli::logging::init(cli.log_format);
                    runtime.block_on(idem_cli::run(cli))
                })
                .map(|()| true)
        }
        Cmd::Run(args) => runtime.block_on(run(args)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("idem-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs every chosen target; `Ok(false)` when a violation was found.
async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let targets = if args.target == "all" {
        Target::ALL.to_vec()
    } else {
        vec![Target::parse(&args.target).with_context(|| {
            let names: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
            format!(
                "unknown target {:?} ({}, all)",
                args.target,
                names.join(", ")
            )
        })?]
    };
    let chosen = Fault::parse_list(&args.faults.join(",")).map_err(anyhow::Error::msg)?;
    let bin = std::env::current_exe().context("finding this binary")?;
    let mut reports = Vec::new();
    for target in targets {
        let plan = Plan {
            seed: args.seed,
            keys: args.keys.unwrap_or_else(|| {
                target.keys_per_second() * args.duration.as_secs().max(1) as usize
            }),
            duplicates: args.duplicates,
            workers: args.workers,
            inflight: args.inflight.unwrap_or(target.inflight()),
            lease: args.lease,
            duration: args.duration,
            fault_every: args.fault_every,
            faults: if chosen.is_empty() {
                target.faults()
            } else {
                chosen.clone()
            },
            replica_acks: !args.no_replica_acks,
            gateway_args: args.gateway_args.clone(),
            ..Plan::new(target, &bin)
        };
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} answered {msg}")
                .context("progress template")?,
        );
        bar.set_prefix(target.name());
        let show = |p: idem_chaos::Progress| {
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
            let phase = if p.faulting { "faulting" } else { "settling" };
            bar.set_message(format!("{} faults, {phase}", p.faults));
        };
        let report = idem_chaos::run(&plan, show)
            .await
            .with_context(|| format!("running {}", target.name()))?;
        bar.finish_and_clear();
        eprint!("{}", report.violation_lines(20));
        reports.push(report);
    }
    std::io::Write::write_all(&mut std::io::stdout(), Report::tables(&reports).as_bytes())
        .context("writing the table")?;
    Ok(reports.iter().all(|r| r.violations().is_empty()))
}
