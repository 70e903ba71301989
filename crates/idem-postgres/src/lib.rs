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
//! key)`, an index on `expires_at`, a partial index of the records in
//! progress by lease, the triggers that announce the end of a waited
//! record and their function `<schema>.idem_announce_end`), the
//! sequence `<schema>.idem_fence`,
//! `<schema>.idem_steps` for journaled steps, `<schema>.idem_inbox` for
//! the inbox, `<schema>.idem_inbox_p` (range-partitioned, partitions
//! `idem_inbox_p_<width>_<start>`) and `<schema>.idem_inbox_p_upkeep` for
//! the partitioned inbox, and `<schema>.idem_migrations` recording what
//! was applied. [`migrations`] hands the SQL to projects
//! that run their own migration tool.
//!
#![doc = include_str!("../docs/cleanup.md")]
#![doc = include_str!("../docs/waiting.md")]

mod admin;
mod blobs;
mod builder;
mod conn;
mod encode;
mod error;
pub mod inbox;
mod many;
mod notify;
pub mod outbox;
mod pending;
mod schema;
mod sql;
mod steps;
mod store;

pub use blobs::PgBlobs;
pub use builder::{
    redact_url, PgStoreBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_SIZE,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_SCHEMA,
};
pub use error::ConnectError;
pub use outbox::Outbox;
pub use schema::{migrations, Migration};
pub use store::PgStore;
