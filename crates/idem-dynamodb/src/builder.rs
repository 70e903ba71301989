//! [`DynamoStoreBuilder`]: defaults, the `dynamodb://` URL, and
//! connecting.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use idem::store::TokenMint;
use idem::Clock;

use crate::conn::ConfigError;
use crate::error::ConnectError;
use crate::request::Table;
use crate::schema::create_table;
use crate::store::{DynamoStore, Inner, Settings};
#[cfg(doc)]
use crate::store::{DEFAULT_COMPRESS_ABOVE, DEFAULT_GRACE};

/// Sets up a [`DynamoStore`]: from a `dynamodb://` URL with
/// [`DynamoStore::builder`], or from a client you built (with
/// `aws-config`, say) with [`DynamoStoreBuilder::new`].
#[derive(Clone)]
pub struct DynamoStoreBuilder {
    table: String,
    client: Option<Client>,
    /// The URL's `endpoint`, `region` and `create`.
    options: idem_aws::UrlOptions,
    settings: Settings,
}

impl std::fmt::Debug for DynamoStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStoreBuilder")
            .field("table", &self.table)
            .field("client", &self.client.is_some())
            .field("options", &self.options)
            .field("grace", &self.settings.grace)
            .field("memory", &self.settings.memory)
            .finish_non_exhaustive()
    }
}

impl DynamoStoreBuilder {
    /// A builder for `table` through `client`, with the defaults.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            client: Some(client),
            options: idem_aws::UrlOptions::default(),
            settings: Settings::default(),
        }
    }

    /// Uses `client` instead of one built from the URL's `endpoint` and
    /// `region` and the environment's credentials.
    pub fn client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Decides time with `clock` instead of the system clock (tests use a
    /// [`ManualClock`](idem::ManualClock)). Every client of one table must
    /// use clocks that agree.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.settings.clock = Arc::new(clock);
        self
    }

    /// Keeps items `grace` past their retention before DynamoDB's TTL may
    /// delete them, so their fence survives that long ([`DEFAULT_GRACE`]).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.settings.grace = grace;
        self
    }

    /// Compresses responses longer than `bytes`, when that is shorter
    /// ([`DEFAULT_COMPRESS_ABOVE`]).
    pub fn compress_above(mut self, bytes: usize) -> Self {
        self.settings.encoding.compress_above = bytes;
        self
    }

    /// Remembers the keys of the records this store ends (completed or
    /// failed) for `memory` past their retention ([`idem::horizon`]): a
    /// late retry is answered `Forgotten` instead of running again. The
    /// memory is kept in the record's item and honoured by every client
    /// of the table; give every client that ends records the same
    /// setting, or the keys of the records the others end are not
    /// remembered. Zero turns it off (the default); the URL's
    /// `remember=30d` says the same.
    pub fn remember_expired(mut self, memory: Duration) -> Self {
        self.settings.memory = Some(memory).filter(|m| !m.is_zero());
        self
    }

    /// Creates the table if it is missing, as
    /// [`create_table`](crate::create_table) does (default: no; the URL's
    /// `create=true` turns it on).
    pub fn create_table(mut self, create: bool) -> Self {
        self.options.create = create;
        self
    }

    /// Builds the client (unless one was given), creates the table if
    /// asked, and returns the store. Without `create_table`, nothing is
    /// sent: a missing table shows on the first call.
    pub async fn connect(self) -> Result<DynamoStore, ConnectError> {
        let client = match self.client {
            Some(client) => client,
            None => self.client_from_url()?,
        };
        if self.options.create {
            create_table(&client, &self.table).await.map_err(|source| {
                ConnectError::CreateTable {
                    table: self.table.clone(),
                    source,
                }
            })?;
        }
        Ok(DynamoStore::build(client, self.table, self.settings))
    }

    /// A client for the URL's endpoint: in its `region` with the
    /// credentials of the environment, or wholly from the environment.
    fn client_from_url(&self) -> Result<Client, ConfigError> {
        Ok(Client::new(
            &self.options.sdk_config(crate::conn::timeouts())?,
        ))
    }
}

impl DynamoStore {
    /// A store on `table` through `client`, with the defaults: the system
    /// clock, [`DEFAULT_GRACE`], [`DEFAULT_COMPRESS_ABOVE`].
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self::build(client, table.into(), Settings::default())
    }

    /// Connects to the table a `dynamodb://` URL names, with the defaults.
    ///
    /// `dynamodb://TABLE[?endpoint=URL][&region=R][&create=true][&remember=30d]`:
    /// the region comes from `region=` or `AWS_REGION`, credentials from
    /// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`); `endpoint=` names a DynamoDB-compatible server
    /// (DynamoDB Local, moto); `create=true` creates the table if it is
    /// missing; `remember=` is
    /// [`remember_expired`](DynamoStoreBuilder::remember_expired).
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::builder(url)?.connect().await
    }

    /// A builder for a `dynamodb://` URL (see [`connect`](Self::connect)),
    /// to set more than the URL says.
    pub fn builder(url: &str) -> Result<DynamoStoreBuilder, ConnectError> {
        let bad = |reason: String| ConnectError::InvalidUrl {
            url: url.to_owned(),
            reason,
        };
        let rest = url
            .strip_prefix("dynamodb://")
            .ok_or_else(|| bad("the scheme must be dynamodb://".to_owned()))?;
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        let table = table.trim_end_matches('/');
        // DynamoDB's rule for table names.
        if !(3..=255).contains(&table.len())
            || !table
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            return Err(bad(format!(
                "the table name {table:?} must be 3 to 255 characters of A-Z a-z 0-9 _ . -"
            )));
        }
        let (options, own) = idem_aws::UrlOptions::parse_with(query, &["remember"]).map_err(bad)?;
        let mut builder = DynamoStoreBuilder {
            table: table.to_owned(),
            client: None,
            options,
            settings: Settings::default(),
        };
        for (_, memory) in own {
            let memory = idem::url::parse_duration(&memory)
                .map_err(|why| bad(format!("remember={memory}: {why}")))?;
            builder = builder.remember_expired(memory);
        }
        Ok(builder)
    }

    pub(crate) fn build(client: Client, table: String, settings: Settings) -> Self {
        Self {
            inner: Arc::new(Inner {
                table: Table {
                    client,
                    name: table,
                },
                settings,
                mint: TokenMint::new(),
                purge_from: parking_lot::Mutex::new(None),
            }),
        }
    }

    /// The same store with `change` made to its settings.
    fn with(self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.inner.settings.clone();
        change(&mut settings);
        let table = self.inner.table.clone();
        Self::build(table.client, table.name, settings)
    }

    /// This store with `clock` (see [`DynamoStoreBuilder::clock`]); the
    /// client is shared.
    pub fn with_clock(self, clock: impl Clock) -> Self {
        self.with(|s| s.clock = Arc::new(clock))
    }

    /// This store with `grace` (see [`DynamoStoreBuilder::grace`]).
    pub fn with_grace(self, grace: Duration) -> Self {
        self.with(|s| s.grace = grace)
    }

    /// This store remembering the keys of the records it ends for
    /// `memory` (see [`DynamoStoreBuilder::remember_expired`]).
    pub fn with_remember_expired(self, memory: Duration) -> Self {
        self.with(|s| s.memory = Some(memory).filter(|m| !m.is_zero()))
    }

    /// This store compressing above `bytes` (see
    /// [`DynamoStoreBuilder::compress_above`]).
    pub fn with_compress_above(self, bytes: usize) -> Self {
        self.with(|s| s.encoding.compress_above = bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_and_bad_ones_say_why() {
        let builder = DynamoStore::builder(
            "dynamodb://idem_records?endpoint=http://127.0.0.1:5000&create=true",
        )
        .expect("valid");
        assert_eq!(builder.table, "idem_records");
        assert_eq!(
            builder.options.endpoint.as_deref(),
            Some("http://127.0.0.1:5000")
        );
        assert_eq!(builder.options.region, None);
        assert!(builder.options.create);
        assert_eq!(builder.settings.memory, None, "no memory unless asked");
        let remembering = DynamoStore::builder("dynamodb://t_1?remember=30d").expect("valid");
        assert_eq!(
            remembering.settings.memory,
            Some(Duration::from_secs(30 * 86_400))
        );
        let off = DynamoStore::builder("dynamodb://t_1?remember=0").expect("valid");
        assert_eq!(off.settings.memory, None, "zero turns it off");
        let trailing = DynamoStore::builder("dynamodb://t_1/?region=eu-west-1").expect("valid");
        assert_eq!(
            (trailing.table.as_str(), trailing.options.region.as_deref()),
            ("t_1", Some("eu-west-1"))
        );
        for (url, needle) in [
            ("dynamodb://ab", "3 to 255"),
            ("dynamodb://t%20x", "3 to 255"),
            ("dynamodb://table?create=yes", "not true or false"),
            ("dynamodb://table?port=1", "remember are taken"),
            ("dynamodb://table?remember=soon", "remember=soon"),
            ("redis://table", "dynamodb://"),
        ] {
            let error = DynamoStore::builder(url).expect_err(url).to_string();
            assert!(error.contains(needle), "{url}: {error}");
        }
    }

    #[test]
    fn a_region_without_credentials_names_the_missing_variable() {
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
            return;
        }
        let builder = DynamoStore::builder("dynamodb://table?region=eu-west-1").expect("valid");
        let error = builder.client_from_url().expect_err("no credentials");
        assert!(error.to_string().contains("AWS_ACCESS_KEY_ID"), "{error}");
    }
}
