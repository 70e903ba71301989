//! [`PgStoreBuilder`]: the settings a URL gives, the defaults, and
//! connecting.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use idem::group::{GroupCommit, Limits, Pairs};
use idem::store::TokenMint;

use crate::error::ConnectError;
use crate::sql::Sql;
use crate::store::{Confirms, Inner, PgStore};
use crate::{conn, notify, schema};

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "public";
/// The default number of pooled connections.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// The default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default response timeout: a call that gets no answer (or no
/// pooled connection) in this time fails with
/// [`StoreError::Unavailable`](idem::StoreError::Unavailable).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// `url` with any password masked, for logs and messages.
pub fn redact_url(url: &str) -> String {
    idem::url::redact(url)
}

/// Sets up a [`PgStore`]: from [`PgStore::builder`].
#[derive(Debug, Clone)]
pub struct PgStoreBuilder {
    url: String,
    config: tokio_postgres::Config,
    tls: conn::ssl_mode::Tls,
    schema: String,
    pool_size: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    listen: bool,
    setup: bool,
    batching: bool,
    memory: Option<Duration>,
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
    /// by your own migration tool from [`migrations`](crate::migrations).
    pub fn setup(mut self, setup: bool) -> Self {
        self.setup = setup;
        self
    }

    /// Remembers the keys of completed and failed records for `memory`
    /// after the purge deletes them, so a late retry is answered
    /// [`Forgotten`](idem::store::ClaimOutcome::Forgotten) instead of run
    /// again ([`idem::horizon`]); zero turns it off (the URL's
    /// `remember=30d`). Kept in the schema (`idem_settings`): every process
    /// on it that does not say remembers alike. A schema that remembers
    /// claims each key in its own statement (no batching of claims).
    pub fn remember_expired(mut self, memory: Duration) -> Self {
        self.memory = Some(memory);
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
            confirms: None,
            inner: Arc::new(Inner {
                pool,
                sql: Sql::new(&self.schema),
                schema: self.schema,
                response_timeout: self.response_timeout,
                tokens: TokenMint::new(),
                listener,
                demotion,
                memory_ms: AtomicU64::new(0),
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
            store.confirms = Some(GroupCommit::new(Confirms(store.clone()), Limits::default()));
            store.groups = Some(Arc::new(Pairs::new(&store)));
        }
        if self.setup {
            store.setup().await.map_err(|source| ConnectError::Setup {
                schema: store.schema().to_owned(),
                source,
            })?;
        }
        store
            .settle_memory(self.memory)
            .await
            .map_err(|source| ConnectError::Setup {
                schema: store.schema().to_owned(),
                source,
            })?;
        Ok(store)
    }
}

impl PgStore {
    /// Connects to `url` with the defaults, creating the tables if needed.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::builder(url)?.connect().await
    }

    /// A builder for `url`, to set more than the URL says.
    pub fn builder(url: &str) -> Result<PgStoreBuilder, ConnectError> {
        let parsed = conn::url::parse_url(url)?;
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
            memory: parsed.remember,
        })
    }
}
