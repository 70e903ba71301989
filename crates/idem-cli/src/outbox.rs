//! `idem outbox run`: the outbox dispatcher as a process of its own, for
//! services whose processes do not run one (or die too often to be
//! trusted with it).
//!
//! It sends what is pending in the store:
//!
//! - the messages runs sent (`Context::send`, `run.send` in the
//!   packages) whose process died or whose broker was away before they
//!   were confirmed: the executor's dispatcher, over every scope that
//!   ever sent ([`Idempotency::dispatch_pending`]);
//! - with `--table`, the standalone transactional outbox that producers
//!   write inside their own transactions (`idem_outbox` on PostgreSQL,
//!   woken by each commit that enqueued; on MySQL and SQLite, looked at
//!   every `--every`).
//!
//! Several may run at once, beside the services' own dispatchers: each
//! message is taken by one claim, fenced.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use idem::outbox::{DispatchPass, OutboxPass, Sender};
use idem::Idempotency;
use idem_engine::store::AnyStore;
use idem_engine::SenderUrl;
use serde_json::json;

/// `idem outbox run`'s settings.
#[derive(Debug, Clone, Args)]
pub struct OutboxRunArgs {
    /// The broker messages go to: `nats://HOST:PORT`, `amqp://…`,
    /// `kafka://HOST:PORT[,…]` or `sqs://[?endpoint=URL&region=R]`
    /// (each in a build with its feature).
    #[arg(long, env = "IDEM_OUTBOX")]
    pub to: String,
    /// How often to look for messages left pending (`500ms`, `5s`, …).
    #[arg(long, default_value = "5s")]
    pub every: String,
    /// Messages taken from the standalone outbox per pass.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
    pub batch: u16,
    /// Also dispatch the standalone transactional outbox (`idem_outbox`,
    /// PostgreSQL, MySQL or SQLite; created if missing).
    #[arg(long)]
    pub table: bool,
    /// Make one pass, print what it did as JSON and exit (non-zero if a
    /// message could not be sent).
    #[arg(long)]
    pub once: bool,
}

/// What one pass sent.
#[derive(Debug, Default, Clone, Copy)]
struct Pass {
    runs: DispatchPass,
    table: Option<OutboxPass>,
}

/// Runs the dispatcher over `store` until `shutdown`, or one pass with
/// `--once`. `keyring` opens the messages of runs whose results are
/// sealed.
pub async fn run(
    store: AnyStore,
    keyring: Option<&Path>,
    args: &OutboxRunArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let every = crate::duration("--every", &args.every)?;
    let table = match args.table {
        true => Some(Table::open(&store)?),
        false => None,
    };
    let sender = args
        .to
        .parse::<SenderUrl>()?
        .open()
        .await
        .map_err(|e| anyhow::anyhow!("--to: {e}"))?;
    let mut builder = Idempotency::builder(store).outbox(Arc::clone(&sender));
    if let Some(path) = keyring {
        let keyring =
            idem::codec::Keyring::from_file(path).map_err(|e| anyhow::anyhow!("--keyring: {e}"))?;
        builder = builder.keyring(keyring);
    }
    let idem = builder
        .build()
        .map_err(|e| anyhow::anyhow!("the outbox dispatcher: {e}"))?;
    let batch = usize::from(args.batch);
    if args.once {
        let pass = Pass {
            runs: idem.dispatch_pending().await?,
            table: match &table {
                Some(table) => Some(table.drain(&sender, batch).await?),
                None => None,
            },
        };
        crate::print_json(&report(&pass));
        let table_failed = pass.table.is_some_and(|t| t.failed);
        anyhow::ensure!(
            pass.runs.failed == 0 && !table_failed,
            "messages could not be sent to {} ({} run(s){}); they stay pending and are tried again",
            args.to,
            pass.runs.failed,
            if table_failed { " and the table" } else { "" }
        );
        return Ok(());
    }
    tracing::info!(to = %args.to, every = ?every, table = args.table, "idem outbox dispatcher running");
    let _runs = idem.spawn_outbox_dispatcher(every);
    let tables = async {
        match &table {
            Some(table) => table.run(&sender, batch, every).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = shutdown => {}
        () = tables => {}
    }
    Ok(())
}

fn report(pass: &Pass) -> serde_json::Value {
    let mut report = json!({
        "runs": {
            "pending": pass.runs.pending,
            "sent": pass.runs.runs,
            "messages": pass.runs.messages,
            "failed": pass.runs.failed,
        }
    });
    if let Some(table) = pass.table {
        report["table"] = json!({
            "taken": table.taken,
            "sent": table.sent,
            "failed": table.failed,
        });
    }
    report
}

/// The standalone transactional outbox of the store's database.
enum Table {
    Postgres(idem_postgres::PgStore, idem_postgres::outbox::Outbox),
    Sqlite(
        std::sync::Mutex<rusqlite::Connection>,
        idem_sqlite::outbox::Outbox,
    ),
    MySql(idem_mysql::MySqlStore, idem_mysql::outbox::Outbox),
}

impl Table {
    /// The store's outbox table, created if missing.
    fn open(store: &AnyStore) -> anyhow::Result<Self> {
        match store {
            // The store applied idem's migrations, the outbox's among them.
            AnyStore::Postgres(pg) => Ok(Table::Postgres(
                pg.clone(),
                idem_postgres::outbox::Outbox::in_schema(pg.schema()),
            )),
            AnyStore::Sqlite(sqlite) => {
                let conn = rusqlite::Connection::open(sqlite.path())?;
                conn.busy_timeout(Duration::from_secs(5))?;
                let outbox = idem_sqlite::outbox::Outbox::new();
                outbox.setup(&conn)?;
                Ok(Table::Sqlite(std::sync::Mutex::new(conn), outbox))
            }
            AnyStore::MySql(mysql) => Ok(Table::MySql(
                mysql.clone(),
                idem_mysql::outbox::Outbox::new(),
            )),
            _ => anyhow::bail!(
                "--table: the standalone outbox is kept in PostgreSQL, MySQL or SQLite; \
                 this store has none"
            ),
        }
    }

    /// Dispatches full batches until one is not, or a send fails.
    async fn drain(&self, sender: &Arc<dyn Sender>, batch: usize) -> anyhow::Result<OutboxPass> {
        Ok(match self {
            Table::Postgres(pg, outbox) => outbox.dispatch_due(pg, sender, batch).await?,
            Table::Sqlite(conn, outbox) => outbox.dispatch_due(conn, sender, batch).await?,
            Table::MySql(mysql, outbox) => outbox.dispatch_due(mysql.pool(), sender, batch).await?,
        })
    }

    /// Dispatches for ever: PostgreSQL's woken by each commit that
    /// enqueued, SQLite's every `every`.
    async fn run(&self, sender: &Arc<dyn Sender>, batch: usize, every: Duration) {
        match self {
            Table::Postgres(pg, outbox) => outbox.run(pg, sender, batch, every).await,
            Table::Sqlite(conn, outbox) => outbox.run(conn, sender, batch, every).await,
            Table::MySql(mysql, outbox) => outbox.run(mysql.pool(), sender, batch, every).await,
        }
    }
}
