//! [`MySqlStoreBuilder`]: the settings a URL gives, the defaults, and
//! connecting.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use idem::group::Pairs;
use idem::store::TokenMint;
use idem::StoreError;
use mysql_async::prelude::Queryable;
use mysql_async::Opts;

use crate::conn;
use crate::error::{mysql_error, ConnectError};
use crate::sql::Sql;
use crate::store::{stored_limit, Inner, MySqlStore, DEFAULT_MAX_PACKET};

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

/// Sets up a [`MySqlStore`]: from [`MySqlStore::builder`].
#[derive(Debug, Clone)]
pub struct MySqlStoreBuilder {
    url: String,
    opts: Opts,
    database: String,
    prefer_socket: bool,
    pool_size: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    setup: bool,
    batching: bool,
    memory: Option<Duration>,
}

impl MySqlStoreBuilder {
    /// How many connections the pool keeps at most ([`DEFAULT_POOL_SIZE`]).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long to wait for the first connection ([`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for a pooled connection and each answer
    /// ([`DEFAULT_RESPONSE_TIMEOUT`]).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Whether claims and completions that callers make at the same time
    /// go to the server together (group commit, default: yes): the claims
    /// as one `idem_claim_many` call, the completions as one
    /// `idem_complete_many` call, so many share one round trip and one
    /// commit. Each stays atomic and is answered on its own; a lone call
    /// runs on its own at once.
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// Remembers the keys of completed and failed records for `memory`
    /// after the purge drops them ([`idem::horizon`]): a late retry of
    /// such a key is answered `Forgotten` instead of running again. Kept
    /// in the database (`idem_settings`, migration 0006), so every process
    /// on it, `idem purge` included, remembers alike; zero turns it off.
    /// A database that remembers claims each key on its own (a read before
    /// the claim and one after), not in batches. The URL's `remember=30d`
    /// says the same.
    pub fn remember_expired(mut self, memory: Duration) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Whether [`connect`](Self::connect) applies the migrations it has not
    /// seen yet (default `true`). Turn it off when the tables are created
    /// by your own migration tool from [`migrations`](crate::migrations).
    pub fn setup(mut self, setup: bool) -> Self {
        self.setup = setup;
        self
    }

    /// Connects (one connection is made to check the server answers) and,
    /// unless turned off, applies the migrations.
    pub async fn connect(self) -> Result<MySqlStore, ConnectError> {
        let url = redact_url(&self.url);
        let pool = conn::pool(self.opts, self.pool_size, self.prefer_socket);
        // One connection, to check the server answers and read the largest
        // packet it takes; it goes back to the pool.
        let first = tokio::time::timeout(self.connect_timeout, async {
            let mut conn = pool.get_conn().await?;
            conn.query_first::<u64, _>("SELECT @@max_allowed_packet")
                .await
        })
        .await;
        let max_packet = match first {
            Ok(Ok(packet)) => packet.unwrap_or(DEFAULT_MAX_PACKET),
            Ok(Err(error)) => {
                return Err(ConnectError::Unavailable {
                    url,
                    source: mysql_error(error),
                })
            }
            Err(_) => {
                return Err(ConnectError::Unavailable {
                    url,
                    source: StoreError::Unavailable(
                        format!("no connection in {:?}", self.connect_timeout).into(),
                    ),
                })
            }
        };
        let mut store = MySqlStore {
            groups: None,
            inner: Arc::new(Inner {
                pool,
                sql: Sql::new(),
                database: self.database,
                response_timeout: self.response_timeout,
                tokens: TokenMint::new(),
                max_stored_bytes: stored_limit(max_packet),
                memory_ms: AtomicU64::new(0),
            }),
        };
        if self.batching {
            store.groups = Some(Arc::new(Pairs::new(&store)));
        }
        if self.setup {
            store.setup().await.map_err(|source| ConnectError::Setup {
                database: store.database().to_owned(),
                source,
            })?;
        }
        store
            .settle_memory(self.memory)
            .await
            .map_err(|source| ConnectError::Setup {
                database: store.database().to_owned(),
                source,
            })?;
        Ok(store)
    }
}

impl MySqlStore {
    /// Connects to `url` with the defaults, creating the tables if needed.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::builder(url)?.connect().await
    }

    /// A builder for `url`, to set more than the URL says.
    pub fn builder(url: &str) -> Result<MySqlStoreBuilder, ConnectError> {
        let parsed = conn::url::parse_url(url)?;
        let opts = match parsed.tls.ssl_opts() {
            #[cfg(feature = "tls")]
            Ok(ssl) => mysql_async::OptsBuilder::from_opts(parsed.opts)
                .ssl_opts(ssl)
                .into(),
            #[cfg(not(feature = "tls"))]
            Ok(_) => parsed.opts,
            Err(reason) => {
                return Err(ConnectError::InvalidUrl {
                    url: redact_url(url),
                    reason,
                })
            }
        };
        Ok(MySqlStoreBuilder {
            url: url.to_owned(),
            opts,
            database: parsed.database,
            prefer_socket: parsed.prefer_socket,
            pool_size: parsed.pool_size.unwrap_or(DEFAULT_POOL_SIZE),
            connect_timeout: parsed.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            response_timeout: parsed.response_timeout.unwrap_or(DEFAULT_RESPONSE_TIMEOUT),
            setup: true,
            batching: true,
            memory: parsed.remember,
        })
    }
}
