//! The `idem` binary as a library: the gateway ([`proxy`]), the admin
//! commands ([`admin`]) and the load generator ([`bench`](mod@bench)),
//! and the command line that drives them ([`Cli`]). `main` only parses
//! and calls [`run`].

use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use idem::{RecordId, Scope, StateKind};

pub mod admin;
pub mod bench;
mod closing;
pub mod connections;
pub mod console;
mod deadline;
pub mod failures;
pub mod forwarded;
pub mod logging;
pub mod outbox;
mod payload;
pub mod proxy;
mod proxy_args;
pub mod reconcile;
mod remember;
pub mod serve;
pub mod tls;
pub mod upstream;

pub use idem_engine::store;
pub use proxy_args::ProxyArgs;
use store::{StoreUrl, DEFAULT_STORE};

/// Exactly-once effects over at-least-once delivery.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about)]
pub struct Cli {
    /// Where records live: `sqlite:PATH` (the embedded durable store, the
    /// default: `sqlite:idem.db` in the working directory), `memory:`,
    /// `redis://[user:pass@]host:port[/db][?namespace=NAME]` (or `rediss://`
    /// for TLS), `redis+cluster://host:port,host:port` for a Cluster,
    /// `postgres://user@host/db[?schema=S]`, `mysql://user@host/db` (MySQL or
    /// MariaDB), or, in a build with the
    /// `dynamodb` feature, `dynamodb://TABLE[?endpoint=URL&region=R&create=true]`.
    #[arg(long, env = "IDEM_STORE", global = true)]
    pub store: Option<String>,
    /// A keyring file, one `id:64-hex-digits` a line, newest first: the
    /// gateway seals stored responses with the first key (all keys open
    /// what they sealed; rotate by adding a line on top); `idem inspect`
    /// opens them to show what they hold [default: none].
    #[arg(long, env = "IDEM_KEYRING", global = true)]
    pub keyring: Option<std::path::PathBuf>,
    /// A file holding the secret (64 hex digits) keys are hashed with at
    /// rest: the gateway stores each record under a keyed hash of its
    /// scope and key; the admin commands hash the key they are given. It
    /// never rotates: another secret forgets every key [default: keys
    /// stored as sent].
    #[arg(long, env = "IDEM_KEY_SECRET", global = true)]
    pub key_secret: Option<std::path::PathBuf>,
    /// How log lines on standard error look: text (coloured only on a
    /// terminal) or json (one object per line).
    #[arg(
        long,
        env = "IDEM_LOG_FORMAT",
        global = true,
        value_enum,
        default_value_t
    )]
    pub log_format: logging::LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve an Idempotency-Key gateway in front of an HTTP service.
    Proxy(Box<ProxyArgs>),
    /// Serve the claim API (HTTP and JSON) for programs in any language.
    Serve(serve::ServeArgs),
    /// Serve the operator console on its own, on any store: records by
    /// state and scope, parked runs, failure groups (charts are on the
    /// gateway's admin listener, where the metrics are).
    Console(console::ConsoleArgs),
    /// The outbox: send what runs and producers left pending.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Print one record as JSON.
    Inspect {
        /// The record's scope (for the gateway: `http METHOD ROUTE`).
        scope: String,
        /// The key.
        key: String,
        /// Write the stored response's body to this file (`-`: standard
        /// output) instead of describing the record: a body kept by
        /// reference is read from its blob, checked against its digest.
        #[arg(long)]
        body: Option<std::path::PathBuf>,
        /// The blob store of bodies kept by reference, as the gateway's
        /// `--blobs` [default: beside the store].
        #[arg(long, env = "IDEM_BLOBS")]
        blobs: Option<String>,
    },
    /// List records as JSON lines.
    List {
        /// Only records in this state.
        #[arg(long, value_enum)]
        state: Option<StateArg>,
        /// Only records in this scope.
        #[arg(long)]
        scope: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Resolve a parked record: say whether its step in doubt took effect
    /// (checked in the external system), then the record is released and
    /// the next delivery resumes after the journaled steps.
    Resolve {
        /// The record's scope.
        scope: String,
        /// The key.
        key: String,
        /// The step in doubt (see `idem inspect`).
        step: String,
        /// The effect happened: journal this JSON as the step's result, so
        /// the step is not run again.
        #[arg(
            long,
            value_name = "JSON",
            conflicts_with = "not_applied",
            required_unless_present = "not_applied"
        )]
        applied: Option<String>,
        /// The effect did not happen: the next attempt runs the step.
        #[arg(long)]
        not_applied: bool,
    },
    /// Failed and parked records grouped by how they failed (class and
    /// message, with ids and numbers taken out), as JSON lines, largest
    /// group first: count, first and last seen, scopes, a few keys.
    Failures {
        /// Only records in this scope.
        #[arg(long)]
        scope: Option<String>,
        /// Read at most this many failed records.
        #[arg(long, default_value_t = 100_000)]
        limit: usize,
    },
    /// Handle a failure group (see `idem failures`) in bulk: release its
    /// keys to run again, or resolve their steps in doubt. Prints a line
    /// per record and a summary.
    Redrive(failures::RedriveArgs),
    /// Force-release a stuck key (its record is deleted; the next request
    /// with it runs).
    Release {
        /// The record's scope.
        scope: String,
        /// The key.
        key: String,
    },
    /// Delete expired records, in batches.
    Purge {
        /// Records per transaction.
        #[arg(long, default_value_t = 1_000)]
        batch: usize,
    },
    /// Count live records by state.
    Stats,
    /// Drive claim → complete through the executor and check that every
    /// unique key ran exactly once.
    Bench {
        /// Unique keys.
        #[arg(long, default_value_t = 10_000)]
        keys: u64,
        /// Fraction of operations that repeat an earlier key, in [0, 1).
        #[arg(long, default_value_t = 0.2)]
        duplicates: f64,
        /// Concurrent callers.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `idem outbox …`.
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Run the dispatcher: send the messages of runs whose process died
    /// or whose broker was away, and (`--table`) the standalone outbox's.
    Run(outbox::OutboxRunArgs),
}

/// A record state on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    /// Claimed, running.
    InProgress,
    /// Completed; replayed to duplicates.
    Completed,
    /// Failed for good; replayed to duplicates.
    Failed,
    /// Released for a retry.
    Released,
    /// Failed with an unknown outcome (a step in doubt): waiting for
    /// `idem resolve`. A subset of `failed`.
    Parked,
}

impl StateArg {
    /// The stored state this selects (`parked` is a kind of `failed`).
    pub fn kind(self) -> StateKind {
        match self {
            StateArg::InProgress => StateKind::InProgress,
            StateArg::Completed => StateKind::Completed,
            StateArg::Failed | StateArg::Parked => StateKind::Failed,
            StateArg::Released => StateKind::Released,
        }
    }
}

/// Parses `500ms`, `30s`, `15m`, `24h` or `7d`.
pub fn duration(flag: &str, text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| anyhow::anyhow!("{flag}: {text:?} is not a duration like 30s, 15m or 24h"))?;
    let (per_unit, in_seconds) = match unit {
        "ms" => (1, false),
        "s" | "" => (1, true),
        "m" => (60, true),
        "h" => (3600, true),
        "d" => (86_400, true),
        _ => anyhow::bail!("{flag}: unit {unit:?} in {text:?} is not one of ms, s, m, h, d"),
    };
    let longest = idem::store::LONGEST_HELD;
    let d = n
        .checked_mul(per_unit)
        .map(|n| {
            if in_seconds {
                Duration::from_secs(n)
            } else {
                Duration::from_millis(n)
            }
        })
        .filter(|d| *d <= longest)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{flag}: {text:?} is longer than idem keeps anything ({}d, a century)",
                longest.as_secs() / 86_400
            )
        })?;
    anyhow::ensure!(!d.is_zero(), "{flag}: must be more than zero");
    Ok(d)
}

/// A wait: a duration, or `0` for none.
pub(crate) fn wait(flag: &str, text: &str) -> anyhow::Result<Duration> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    duration(flag, text)
}

pub(crate) fn record_id(scope: &str, key: &str) -> anyhow::Result<RecordId> {
    Ok(RecordId::new(
        Scope::new(scope).map_err(|e| anyhow::anyhow!("scope: {e}"))?,
        idem::KeyRules::default()
            .max_len(std::num::NonZeroUsize::MAX)
            .parse(key)
            .map_err(|e| anyhow::anyhow!("key: {e}"))?,
    ))
}

pub(crate) fn print_json(value: &serde_json::Value) {
    #[allow(clippy::print_stdout)]
    {
        println!("{value}");
    }
}

/// The `--scope` of an admin command, checked.
fn scope_arg(scope: Option<String>) -> anyhow::Result<Option<Scope>> {
    scope
        .map(|s| Scope::new(&s).map_err(|e| anyhow::anyhow!("--scope: {e}")))
        .transpose()
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if let Command::Proxy(args) = cli.command {
        let mut args = (*args).with_file()?;
        if cli.store.is_some() {
            args.store = cli.store;
        }
        if cli.keyring.is_some() {
            args.keyring = cli.keyring;
        }
        if cli.key_secret.is_some() {
            args.key_secret = cli.key_secret;
        }
        return run_proxy(args).await;
    }
    if let Command::Serve(args) = &cli.command {
        let secrets = admin::Secrets::read(cli.keyring.as_deref(), cli.key_secret.as_deref())?;
        return run_serve(cli.store.as_deref(), args, secrets).await;
    }
    let url: StoreUrl = cli.store.as_deref().unwrap_or(DEFAULT_STORE).parse()?;
    let store = url.open().await?;
    if let Command::Outbox(OutboxCommand::Run(args)) = &cli.command {
        return outbox::run(store, cli.keyring.as_deref(), args, shutdown_signal()).await;
    }
    let secrets = admin::Secrets::read(cli.keyring.as_deref(), cli.key_secret.as_deref())?;
    if let Command::Console(args) = &cli.command {
        return console::serve_alone(store, args, secrets, shutdown_signal()).await;
    }
    // The record the admin commands name, as stored (its key hashed
    // under --key-secret).
    let stored_id =
        |scope: &str, key: &str| Ok::<_, anyhow::Error>(secrets.stored_id(&record_id(scope, key)?));
    match cli.command {
        Command::Proxy(_) | Command::Serve(_) | Command::Outbox(_) | Command::Console(_) => {
            unreachable!("handled above")
        }
        Command::Inspect {
            scope,
            key,
            body: None,
            ..
        } => match admin::inspect(&store, &stored_id(&scope, &key)?, &secrets).await? {
            Some(record) => print_json(&record),
            None => anyhow::bail!("no live record for scope {scope:?}, key {key:?} in {url}"),
        },
        Command::Inspect {
            scope,
            key,
            body: Some(path),
            blobs,
        } => {
            let blobs = async {
                Ok(match blobs.as_deref() {
                    Some(given) => {
                        Some(given.parse::<idem_engine::store::BlobUrl>()?.open().await?)
                    }
                    None => store.blobs_beside(true)?,
                })
            };
            let id = stored_id(&scope, &key)?;
            let written = if path.as_os_str() == "-" {
                admin::write_body(&store, &id, &secrets, blobs, &mut std::io::stdout()).await?
            } else {
                let mut file = std::fs::File::create(&path)
                    .map_err(|e| anyhow::anyhow!("--body {}: {e}", path.display()))?;
                admin::write_body(&store, &id, &secrets, blobs, &mut file).await?
            };
            if !written {
                anyhow::bail!("no completed record for scope {scope:?}, key {key:?} in {url}");
            }
        }
        Command::List {
            state,
            scope,
            limit,
        } => {
            let scope = scope_arg(scope)?;
            let records = match state {
                Some(StateArg::Parked) => {
                    admin::list_parked(&store, scope, limit, &secrets).await?
                }
                state => admin::list(&store, state.map(StateArg::kind), scope, limit).await?,
            };
            for record in records {
                print_json(&record);
            }
        }
        Command::Resolve {
            scope,
            key,
            step,
            applied,
            not_applied: _,
        } => {
            let resolution = admin::resolution(applied.as_deref())?;
            let id = stored_id(&scope, &key)?;
            admin::resolve(&store, &id, &step, resolution, &secrets).await?;
            print_json(&serde_json::json!({ "resolved": step, "state": "released" }));
        }
        Command::Failures { scope, limit } => {
            for group in failures::failures(&store, scope_arg(scope)?, limit).await? {
                print_json(&group);
            }
        }
        Command::Redrive(args) => {
            let scope = scope_arg(args.scope.clone())?;
            let (group, action) = (&args.group, args.action()?);
            let lines = failures::redrive(
                &store,
                group,
                &action,
                scope,
                args.limit,
                args.dry_run,
                &secrets,
            )
            .await?;
            for line in lines {
                print_json(&line);
            }
        }
        Command::Release { scope, key } => {
            let released = admin::release(&store, &stored_id(&scope, &key)?).await?;
            print_json(&serde_json::json!({ "released": released }));
        }
        Command::Purge { batch } => {
            let purged = admin::purge(&store, batch, progress).await?;
            print_json(&serde_json::json!({ "purged": purged }));
        }
        Command::Stats => print_json(&admin::stats(&store, progress).await?),
        Command::Bench {
            keys,
            duplicates,
            concurrency,
            json,
        } => {
            let config = bench::BenchConfig {
                keys,
                duplicates,
                concurrency,
                progress: progress && !json,
            };
            let report = bench::run(store, &config).await?;
            if json {
                print_json(&serde_json::to_value(&report)?);
            } else {
                #[allow(clippy::print_stdout)]
                {
                    println!(
                        "{} ops in {:.2} s: {:.0} ops/s, p50 {} µs, p99 {} µs\n\
                         unique keys {}, executions {}, replays {}, errors {}",
                        report.operations,
                        report.seconds,
                        report.ops_per_sec,
                        report.p50_us,
                        report.p99_us,
                        report.unique_keys,
                        report.executions,
                        report.replays,
                        report.errors
                    );
                }
            }
            anyhow::ensure!(
                report.executions == report.unique_keys && report.errors == 0,
                "executions ({}) differ from unique keys ({}), or operations failed ({})",
                report.executions,
                report.unique_keys,
                report.errors
            );
        }
    }
    Ok(())
}

async fn run_proxy(args: ProxyArgs) -> anyhow::Result<()> {
    let mut config = args.proxy_config()?;
    let url = args.store_url()?;
    let store = url.open().await?;
    config.blobs = args.open_blobs(&store, &config.keep).await?;
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| tracing::warn!(error = %e, "metrics recorder not installed"))
        .ok();
    let listen = args.listen.as_deref().unwrap_or("127.0.0.1:8080");
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let console = args.console(metrics.as_ref())?;
    let admin = match args.admin_listen.as_deref().unwrap_or("127.0.0.1:9090") {
        "off" if console.is_some() => {
            anyhow::bail!("--admin-token serves the console on the admin listener: not with --admin-listen off")
        }
        "off" => None,
        addr => Some(proxy::Admin {
            listener: tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (admin): {e}"))?,
            metrics,
            console,
        }),
    };
    if let Some(admin) = admin.as_ref().filter(|a| a.console.is_some()) {
        console::warn_if_exposed(&admin.listener);
    }
    tracing::info!(
        listen = %proxy::local_addr(&listener),
        admin = admin.as_ref().map(|a| proxy::local_addr(&a.listener)),
        upstream = %config.upstream,
        store = %url,
        "idem proxy ready"
    );
    proxy::serve(store, &config, listener, admin, shutdown_signal()).await
}

async fn run_serve(
    store: Option<&str>,
    args: &serve::ServeArgs,
    secrets: admin::Secrets,
) -> anyhow::Result<()> {
    let config = args.open(secrets.clone()).await?;
    let url: StoreUrl = store.unwrap_or(DEFAULT_STORE).parse()?;
    let store = url.open().await?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    let _admin = serve::admin(args, secrets, &store).await?;
    if config.tenants.is_open() {
        tracing::warn!(
            "no --tokens: every caller acts as tenant {:?}",
            serve::OPEN_TENANT
        );
    }
    tracing::info!(
        listen = %proxy::local_addr(&listener),
        store = %url,
        tenants = config.tenants.count(),
        "idem serve ready"
    );
    serve::serve(store, config, listener, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_and_refuse_what_idem_cannot_keep() {
        assert_eq!(
            duration("--lease", "30s").ok(),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            duration("--lease", "250ms").ok(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            duration("--retention", "36500d").ok(),
            Some(idem::store::LONGEST_HELD)
        );
        for (text, needle) in [
            // 5124095576030432 h is just over u64::MAX seconds: it used to
            // wrap to about an hour in a release build.
            ("5124095576030432h", "longer than idem keeps"),
            ("36501d", "longer than idem keeps"),
            ("18446744073709551615m", "longer than idem keeps"),
            ("99999999999999999999s", "is not a duration"),
            ("0s", "more than zero"),
            ("2w", "not one of"),
        ] {
            let error = duration("--retention", text).expect_err(text).to_string();
            assert!(error.contains(needle), "{text}: {error}");
            assert!(error.starts_with("--retention"), "{text}: {error}");
        }
    }
}
