//! # idem-postgres: the PostgreSQL store and transactional inbox
//!
//! Two ways to keep idem's records in PostgreSQL:
//!
//! - **[`PgStore`]**, the store of the [store contract](idem::contract),
//!   for effects outside the database (a payment API, an email, a call to
//!   another service). Every transition is **one statement** (`sql/*.sql`
//!   in this crate: `INSERT … ON CONFLICT … DO UPDATE … WHERE …
//!   RETURNING` for a claim, a token-checked `UPDATE` for each write),
//!   decided with the server's `now()`, in its own short transaction: no
//!   transaction is held open while a handler runs. Claims made at the
//!   same time share one `claim_many` statement, and completions one
//!   `complete_many` statement (group commit,
//!   [`PgStoreBuilder::batching`]), each still answered on its own.
//!   Leases are fenced by tokens no other claim ever gets, and fencing
//!   numbers come from a sequence, so they rise per key across expiry,
//!   delete and purge.
//! - **[`inbox`]**, for effects that live in the same database: the dedup
//!   row is written inside *your* transaction and commits or rolls back
//!   with your business writes. It is the strongest mode; reach for it (or
//!   for natural idempotency, described there) first.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, RecordId};
//! use idem_postgres::PgStore;
//!
//! // Creates the schema's tables on first use (see `PgStore::builder`).
//! let store = PgStore::connect("postgres://app@127.0.0.1:5432/orders?schema=idem").await?;
//! let idem = Idempotency::builder(store).build()?;
//! let id = RecordId::parse("charges", "order-42")?;
//! let charge = idem
//!     .run(&id, None, |_| async { Ok::<_, std::io::Error>("ch_1".to_owned()) })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! ## URLs
//!
//! `postgres://[user[:password]@]host[:port]/database[?params]`
//! (or `postgresql://`). idem reads `schema` (default `public`),
//! `pool_size` (default [`DEFAULT_POOL_SIZE`]), `connect_timeout` and
//! `response_timeout` (`500ms`, `2s`), `listen` (default `true`; see
//! [Waiting duplicates](#waiting-duplicates)), `sslmode` and `sslrootcert`; every
//! other parameter (`application_name`, `options`, …) goes to
//! tokio-postgres. Passwords never appear in error messages.
//!
//! ## TLS (the `tls` feature)
//!
//! `sslmode` means what it means to libpq, so a URL that works with `psql`
//! works here:
//!
//! | `sslmode` | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | no | - |
//! | `prefer` (default) | if the server offers TLS | no; with an `sslrootcert` file, as `verify-ca` |
//! | `require` | yes | no; with an `sslrootcert` file, as `verify-ca` |
//! | `verify-ca` | yes | chain to a root in the `sslrootcert` file (required) |
//! | `verify-full` | yes | chain to a trusted root, and the host name |
//!
//! Only `verify-full` stops an active attacker in between; use it. The
//! trusted roots are the PEM file `sslrootcert=PATH` names (`%20` and the
//! like decoded); for `verify-full` without one (or with
//! `sslrootcert=system`), the platform's. Unlike libpq, idem does not read
//! `~/.postgresql/root.crt`: name the file. Without the feature, `disable`
//! and `prefer` (which then stays plain) are the only modes; any other is
//! refused with an error saying so. Client certificates (`sslcert`,
//! `sslkey`) are not supported.
//!
//! ## Tables
//!
//! `<schema>.idem_records` (one row per record, `PRIMARY KEY (scope,
//! key)`, an index on `expires_at`, the triggers that announce the end of
//! a waited record and their function `<schema>.idem_announce_end`), the sequence `<schema>.idem_fence`,
//! `<schema>.idem_steps` for journaled steps, `<schema>.idem_inbox` for
//! the inbox, `<schema>.idem_inbox_p` (range-partitioned, partitions
//! `idem_inbox_p_<width>_<start>`) and `<schema>.idem_inbox_p_upkeep` for
//! the partitioned inbox, and `<schema>.idem_migrations` recording what
//! was applied. [`migrations`] hands the SQL to projects
//! that run their own migration tool.
//!
#![doc = include_str!("../docs/cleanup.md")]
#![doc = include_str!("../docs/waiting.md")]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::{Object, Pool};
use idem::{
    journal_of, ClaimOutcome, ClaimParams, DeleteRecord, DynStepJournal, Failure, FindAbandoned,
    GetRecord, Lease, ListPage, ListQuery, ListRecords, PurgeExpired, Record, RecordId, RecordTtl,
    Resolution, Resolved, Scope, StepBegin, StepEntry, StepJournal, Store, StoreError, Timestamp,
    TokenMint,
};
use sha2::{Digest, Sha256};
use tokio_postgres::error::SqlState;
use tokio_postgres::{GenericClient, Statement};

mod conn;
mod error;
mod group;
pub mod inbox;
mod many;
mod notify;
mod row;
mod schema;
#[cfg(feature = "tls")]
mod tls;

use error::{pg_error, pool_error};
use row::{ms, token_bytes};
pub use schema::{migrations, Migration};

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "public";
/// The default number of pooled connections.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default response timeout: a call that gets no answer (or no
/// pooled connection) in this time fails with [`StoreError::Unavailable`].
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times a claim runs its statement when the statement's
/// snapshot keeps missing a row that a concurrent claim just committed.
const CLAIM_ROUNDS: usize = 8;

/// `url` with any password masked, for logs and messages.
pub fn redact_url(url: &str) -> String {
    idem::url::redact(url)
}

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL cannot be used. The message never contains the password.
    #[error("invalid PostgreSQL URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The schema is not 1 to 63 characters of `a-z 0-9 _` (not starting
    /// with a digit).
    #[error(
        "invalid schema {0:?}: use 1 to 63 characters of a-z 0-9 _, not starting with a digit"
    )]
    InvalidSchema(String),
    /// The server did not answer, or refused the connection.
    #[error("could not connect to PostgreSQL at {url}")]
    Unavailable {
        /// The URL, password masked.
        url: String,
        /// What went wrong.
        #[source]
        source: StoreError,
    },
    /// Applying the migrations failed (often: no right to create tables in
    /// the schema; apply [`migrations`] as an owner instead and connect
    /// with `.setup(false)`).
    #[error("could not create idem's tables in schema {schema}")]
    Setup {
        /// The schema.
        schema: String,
        /// What the server said.
        #[source]
        source: StoreError,
    },
}

/// Sets up a [`PgStore`]: from [`PgStore::builder`].
#[derive(Debug, Clone)]
pub struct PgStoreBuilder {
    url: String,
    config: tokio_postgres::Config,
    tls: conn::Tls,
    schema: String,
    pool_size: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    listen: bool,
    setup: bool,
    batching: bool,
}

impl PgStoreBuilder {
    /// The schema holding idem's tables ([`DEFAULT_SCHEMA`]).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How many connections the pool keeps at most ([`DEFAULT_POOL_SIZE`]).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long to wait for a new connection ([`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for a pooled connection and for each answer
    /// ([`DEFAULT_RESPONSE_TIMEOUT`]).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Whether waiting duplicates are woken by LISTEN/NOTIFY on a
    /// connection of the store's own (default `true`; the URL's `listen`).
    /// Turn it off where notifications cannot arrive, as through PgBouncer
    /// in transaction mode: waits then poll (5 ms doubling to 200 ms)
    /// instead of relying on the safety net's read each second.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Whether claims and completions that callers make at the same time
    /// go to PostgreSQL together (group commit, default: yes): the claims
    /// as one `claim_many` statement, the completions as one
    /// `complete_many` statement, so many calls share one statement and
    /// one WAL flush. Each stays atomic and is answered on its own; a
    /// lone call runs its own statement at once. Under load this is what
    /// lets the store keep up with a busy consumer or many HTTP callers.
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// Whether [`connect`](Self::connect) applies the migrations it has not
    /// seen yet (default `true`). Turn it off when the tables are created
    /// by your own migration tool from [`migrations`].
    pub fn setup(mut self, setup: bool) -> Self {
        self.setup = setup;
        self
    }

    /// Connects (one connection is made to check the server answers) and,
    /// unless turned off, applies the migrations.
    pub async fn connect(self) -> Result<PgStore, ConnectError> {
        if !schema::valid_schema(&self.schema) {
            return Err(ConnectError::InvalidSchema(self.schema));
        }
        let url = redact_url(&self.url);
        let listener = notify::Listener::new(
            self.config.clone(),
            self.tls.clone(),
            self.listen,
            self.connect_timeout,
            self.response_timeout,
        );
        let demotion = Arc::new(conn::Demotion::default());
        let pool = conn::pool(
            self.config,
            &self.tls,
            self.pool_size,
            self.connect_timeout,
            self.response_timeout,
            demotion.clone(),
        )
        .map_err(|reason| ConnectError::InvalidUrl {
            url: url.clone(),
            reason,
        })?;
        let mut store = PgStore {
            groups: None,
            inner: Arc::new(Inner {
                pool,
                sql: Sql::new(&self.schema),
                schema: self.schema,
                response_timeout: self.response_timeout,
                tokens: TokenMint::new(),
                listener,
                demotion,
            }),
        };
        // One connection, to check the server answers; it goes back to the pool.
        drop(
            store
                .client()
                .await
                .map_err(|source| ConnectError::Unavailable { url, source })?,
        );
        if self.batching {
            store.groups = Some(Arc::new(group::Groups::new(&store)));
        }
        if self.setup {
            store.setup().await.map_err(|source| ConnectError::Setup {
                schema: store.schema().to_owned(),
                source,
            })?;
        }
        Ok(store)
    }
}

/// The statements, with the schema filled in.
#[derive(Debug)]
struct Sql {
    claim: String,
    claim_many: String,
    complete: String,
    complete_many: String,
    fail: String,
    extend: String,
    release: String,
    get: String,
    list: String,
    abandoned: String,
    delete: String,
    purge: String,
    state: String,
    wait: String,
    ttl: String,
    step_begin: String,
    step_finish: String,
    steps: String,
    resolve: String,
}

impl Sql {
    fn new(schema_name: &str) -> Self {
        let r = |sql: &str| schema::render(sql, schema_name);
        let claim = |sql: &str| {
            let rules = include_str!("../sql/claim_rules.sql")
                .lines()
                .filter(|l| !l.starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n");
            r(&sql.replace("{claim_rules}", &rules))
        };
        Self {
            claim: claim(include_str!("../sql/claim.sql")),
            claim_many: claim(include_str!("../sql/claim_many.sql")),
            complete: r(include_str!("../sql/complete.sql")),
            complete_many: r(include_str!("../sql/complete_many.sql")),
            fail: r(include_str!("../sql/fail.sql")),
            extend: r(include_str!("../sql/extend.sql")),
            release: r(include_str!("../sql/release.sql")),
            get: r(include_str!("../sql/get.sql")),
            list: r(include_str!("../sql/list.sql")),
            abandoned: r(include_str!("../sql/abandoned.sql")),
            delete: r(include_str!("../sql/delete.sql")),
            purge: r(include_str!("../sql/purge.sql")),
            ttl: r(include_str!("../sql/ttl.sql")),
            step_begin: r(include_str!("../sql/step_begin.sql")),
            step_finish: r(include_str!("../sql/step_finish.sql")),
            steps: r(include_str!("../sql/steps.sql")),
            resolve: r(include_str!("../sql/resolve.sql")),
            wait: r(include_str!("../sql/wait.sql")),
            state: r("SELECT state FROM {schema}.idem_records WHERE scope = $1 AND key = $2"),
        }
    }
}

/// The PostgreSQL store. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
    /// Claims and completions made together go together (unless turned
    /// off); `None` in the copies the groups send through.
    groups: Option<Arc<group::Groups>>,
}

#[derive(Debug)]
struct Inner {
    pool: Pool,
    sql: Sql,
    schema: String,
    response_timeout: Duration,
    tokens: TokenMint,
    listener: notify::Listener,
    /// A failover seen by a connection of `pool`.
    demotion: Arc<conn::Demotion>,
}

impl PgStore {
    /// Connects to `url` with the defaults, creating the tables if needed.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::builder(url)?.connect().await
    }

    /// A builder for `url`, to set more than the URL says.
    pub fn builder(url: &str) -> Result<PgStoreBuilder, ConnectError> {
        let parsed = conn::parse_url(url)?;
        Ok(PgStoreBuilder {
            url: url.to_owned(),
            config: parsed.config,
            tls: parsed.tls,
            schema: parsed.schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_owned()),
            pool_size: parsed.pool_size.unwrap_or(DEFAULT_POOL_SIZE),
            connect_timeout: parsed.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            response_timeout: parsed.response_timeout.unwrap_or(DEFAULT_RESPONSE_TIMEOUT),
            listen: parsed.listen.unwrap_or(true),
            setup: true,
            batching: true,
        })
    }

    /// The schema holding the tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The claim statement as this store runs it (for `pgbench`); its
    /// parameters are listed at the top of `sql/claim.sql`.
    pub fn claim_sql(&self) -> &str {
        &self.inner.sql.claim
    }

    /// The batch claim statement as this store runs it (for `pgbench`);
    /// its parameters, one array element per claim, are listed at the top
    /// of `sql/claim_many.sql`.
    pub fn claim_many_sql(&self) -> &str {
        &self.inner.sql.claim_many
    }

    /// The complete statement as this store runs it (for `pgbench`).
    pub fn complete_sql(&self) -> &str {
        &self.inner.sql.complete
    }

    /// The statement that marks a journaled step started (for `pgbench`);
    /// its parameters are listed at the top of `sql/step_begin.sql`.
    pub fn step_begin_sql(&self) -> &str {
        &self.inner.sql.step_begin
    }

    /// The statement that journals a step's result (for `pgbench`).
    pub fn step_finish_sql(&self) -> &str {
        &self.inner.sql.step_finish
    }

    /// Applies the migrations not applied yet; returns their versions.
    pub async fn setup(&self) -> Result<Vec<i32>, StoreError> {
        let mut client = self.client().await?;
        let schema = self.schema();
        let applied = self.timed(schema::apply(&mut client, schema)).await?;
        if !applied.is_empty() {
            tracing::info!(%schema, ?applied, "applied idem migrations");
        }
        Ok(applied)
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.inner.pool.get().await.map_err(pool_error)
    }

    /// Runs `fut` under the response timeout, mapping its error.
    async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.response_timeout, fut).await {
            Ok(Err(error)) if error.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) => {
                self.inner.demotion.seen();
                Err(pg_error(error))
            }
            Ok(result) => result.map_err(pg_error),
            Err(_) => Err(StoreError::Unavailable(
                format!(
                    "PostgreSQL did not answer in {:?}",
                    self.inner.response_timeout
                )
                .into(),
            )),
        }
    }

    async fn prepare(&self, client: &Object, sql: &str) -> Result<Statement, StoreError> {
        self.timed(client.prepare_cached(sql)).await
    }

    /// Claims on `client` (a connection, or the transaction of a batch).
    async fn claim_on(
        &self,
        client: &impl GenericClient,
        statement: &Statement,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let fingerprint = params.fingerprint.map(|f| f.as_bytes().to_vec());
        let (lease, retention) = (ms(params.lease), ms(params.retention));
        for _ in 0..CLAIM_ROUNDS {
            let token = self.inner.tokens.next();
            let rows = self
                .timed(client.query(
                    statement,
                    &[
                        &id.scope().as_str(),
                        &id.key().as_str(),
                        &fingerprint,
                        &&token_bytes(token)[..],
                        &lease,
                        &retention,
                    ],
                ))
                .await?;
            if let Some(outcome) = row::claim_outcome(rows.first(), id, token, params.fingerprint)?
            {
                return Ok(outcome);
            }
        }
        Ok(ClaimOutcome::InProgress {
            retry_after: Duration::from_millis(10),
        })
    }

    /// Runs `sql` (prepared once per connection) on a pooled connection;
    /// its rows.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        let statement = self.prepare(&client, sql).await?;
        self.timed(client.query(&statement, params)).await
    }

    /// Runs a holder's write; the number of rows it changed.
    async fn write(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let statement = self.prepare(&client, sql).await?;
        self.timed(client.execute(&statement, params)).await
    }
}

impl StepJournal for PgStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let attempt = i32::try_from(lease.attempt).unwrap_or(i32::MAX);
        let rows = self
            .query(
                &self.inner.sql.step_begin,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &step,
                    &attempt,
                ],
            )
            .await?;
        row::step_begin(&lease.id, lease.attempt, rows.first())
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let changed = self
            .write(
                &self.inner.sql.step_finish,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &step,
                    &&result[..],
                ],
            )
            .await?;
        lease_written(changed)
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.steps,
                &[&id.scope().as_str(), &id.key().as_str()],
            )
            .await?;
        rows.iter().map(|r| row::step_entry(id, r)).collect()
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let (applied, result) = match resolution {
            Resolution::Applied(result) => (true, result),
            Resolution::NotApplied => (false, Bytes::new()),
        };
        let rows = self
            .query(
                &self.inner.sql.resolve,
                &[
                    &id.scope().as_str(),
                    &id.key().as_str(),
                    &step,
                    &applied,
                    &&result[..],
                ],
            )
            .await?;
        row::resolved(id, rows.first())
    }
}

fn lease_written(changed: u64) -> Result<(), StoreError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

impl PgStore {
    /// One claim statement, on a connection of the pool.
    async fn claim_single(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let client = self.client().await?;
        let statement = self.prepare(&client, &self.inner.sql.claim).await?;
        self.claim_on(&**client, &statement, id, params).await
    }

    /// One complete statement.
    async fn complete_single(
        &self,
        lease: &Lease,
        response: &[u8],
        retention: Duration,
    ) -> Result<(), StoreError> {
        let changed = self
            .write(
                &self.inner.sql.complete,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &response,
                    &ms(retention),
                ],
            )
            .await?;
        lease_written(changed)
    }
}

impl Store for PgStore {
    async fn peek(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        GetRecord::get(self, id).await
    }

    fn step_journal(&self) -> Option<Arc<dyn DynStepJournal>> {
        Some(journal_of(self.clone()))
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        match &self.groups {
            Some(groups) => groups.claim(id, params).await,
            None => self.claim_single(id, params).await,
        }
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        match &self.groups {
            Some(groups) => groups.complete(lease, response, retention).await,
            None => self.complete_single(lease, &response, retention).await,
        }
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let changed = self
            .write(
                &self.inner.sql.fail,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &failure.class.as_str(),
                    &failure.message.as_bytes(),
                    &ms(retention),
                ],
            )
            .await?;
        lease_written(changed)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.extend,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &ms(duration),
                ],
            )
            .await?;
        let row = rows.first().ok_or(StoreError::LeaseLost)?;
        let until: std::time::SystemTime = row.try_get(0).map_err(|e| StoreError::Corrupt {
            id: lease.id.to_string(),
            reason: format!("lease_until: {e}"),
        })?;
        Ok(row::timestamp(until))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let changed = self
            .write(
                &self.inner.sql.release,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                ],
            )
            .await?;
        lease_written(changed)
    }

    /// Waits for the record's end to be announced (see `notify.rs`) or
    /// `timeout`; returns at once if the record is not in progress. The
    /// caller claims again either way; the claim decides.
    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        self.wait_announced(id, timeout).await;
    }
}

impl GetRecord for PgStore {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.get,
                &[&id.scope().as_str(), &id.key().as_str()],
            )
            .await?;
        rows.first()
            .map(|r| row::record(r).map(|(_, record)| record))
            .transpose()
    }
}

impl RecordTtl for PgStore {
    async fn ttl(&self, id: &RecordId, response: &[u8]) -> Result<Option<Duration>, StoreError> {
        // The response's digest, not the response: 32 bytes on the wire.
        let digest = Sha256::digest(response).to_vec();
        let rows = self
            .query(
                &self.inner.sql.ttl,
                &[&id.scope().as_str(), &id.key().as_str(), &digest],
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r.try_get::<_, i64>(0).ok())
            .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs())))
    }
}

impl DeleteRecord for PgStore {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.delete,
                &[&id.scope().as_str(), &id.key().as_str()],
            )
            .await?;
        Ok(rows
            .first()
            .is_some_and(|r| r.try_get::<_, bool>(0).unwrap_or(false)))
    }
}

impl ListRecords for PgStore {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                &self.inner.sql.list,
                &[
                    &query.state.map(|s| s.as_str()),
                    &query.scope.as_ref().map(|s| s.as_str()),
                    &query.after.as_ref().map(|a| a.scope().as_str()),
                    &query.after.as_ref().map(|a| a.key().as_str()),
                    &limit,
                ],
            )
            .await?;
        let records = rows
            .iter()
            .map(row::record)
            .collect::<Result<Vec<_>, _>>()?;
        let next = (records.len() == query.limit && query.limit > 0)
            .then(|| records.last().map(|(id, _)| id.clone()))
            .flatten();
        Ok(ListPage { records, next })
    }
}

impl FindAbandoned for PgStore {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(&self.inner.sql.abandoned, &[&scope.as_str(), &limit])
            .await?;
        rows.iter().map(row::record).collect()
    }
}

impl PurgeExpired for PgStore {
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let changed = self.write(&self.inner.sql.purge, &[&limit]).await?;
        Ok(usize::try_from(changed).unwrap_or(usize::MAX))
    }
}
