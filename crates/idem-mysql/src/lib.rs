//! # idem-mysql: the MySQL and MariaDB store and transactional inbox
//!
//! Two ways to keep idem's records in MySQL (8.0 and later) or MariaDB
//! (10.6 and later):
//!
//! - **[`MySqlStore`]**, the store of the [store contract](idem::contract),
//!   for effects outside the database (a payment API, an email, a call to
//!   another service). Every transition is **one round trip**: a
//!   token-checked `UPDATE` for each write (`sql/*.sql` in this crate), and
//!   a stored procedure where a transition reads before it writes (the
//!   claim, the lease extension and the step journal,
//!   `migrations/0004_procedures.sql`), decided with the server's clock
//!   (`UTC_TIMESTAMP(6)`, read after the row is locked), each in its own
//!   short transaction: no transaction is held open while a handler runs.
//!   Claims made at the same time share one `idem_claim_many` call, and
//!   completions one `idem_complete_many` call (group commit,
//!   [`MySqlStoreBuilder::batching`]), each still answered on its own.
//!   Leases are fenced by tokens no other claim ever gets.
//! - **[`inbox`]**, for effects that live in the same database: the dedup
//!   row is written inside *your* transaction and commits or rolls back
//!   with your business writes. It is the strongest mode; reach for it
//!   first.
//! - **[`outbox`]**, for messages a producer sends: enqueued inside your
//!   transaction, sent by a dispatcher once it committed.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, RecordId};
//! use idem_mysql::MySqlStore;
//!
//! // Creates the tables and procedures on first use (see `MySqlStore::builder`).
//! let store = MySqlStore::connect("mysql://app@127.0.0.1:3306/orders").await?;
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
//! `mysql://[user[:password]@]host[:port]/database[?params]` (or
//! `mariadb://`). idem reads `pool_size` (default [`DEFAULT_POOL_SIZE`]),
//! `connect_timeout` and `response_timeout` (`500ms`, `2s`), `remember`
//! (`30d`: how long expired keys are remembered, see
//! [`MySqlStoreBuilder::remember_expired`]), `ssl-mode` and `ssl-ca`;
//! every other parameter (`stmt_cache_size`,
//! `max_allowed_packet`, …) goes to mysql_async. The connection goes to
//! the host and port named, over TCP, unless `prefer_socket=true`.
//! Passwords never appear in error messages.
//!
//! ## TLS (the `tls` feature)
//!
//! `ssl-mode` means what it means to the `mysql` client:
//!
//! | `ssl-mode` | encrypted | server certificate checked |
//! |---|---|---|
//! | `DISABLED` (default) | no | - |
//! | `REQUIRED` | yes | no; with an `ssl-ca` file, as `VERIFY_CA` |
//! | `VERIFY_CA` | yes | chain to a root in the `ssl-ca` file (required) |
//! | `VERIFY_IDENTITY` | yes | chain to a trusted root (`ssl-ca`, or the web's roots), and the host name |
//!
//! Only `VERIFY_IDENTITY` stops an active attacker in between; use it.
//! `PREFERRED` is refused: a connection that may silently stay plain
//! protects nothing.
//!
//! ## Tables
//!
//! In the URL's database: `idem_records` (one row per record, `PRIMARY
//! KEY (scope, key)` as bytes, so ids sort as idem lists them),
//! `idem_steps` for journaled steps, `idem_inbox` for the inbox,
//! `idem_horizon` and `idem_settings` for the memory of expired keys, the
//! `idem_*` procedures, and `idem_migrations` recording what was applied.
//! Scopes are at most 512 bytes and keys at most 2,048 (a longer key is
//! refused, never cut). [`migrations`] hands the SQL to projects that run
//! their own migration tool (the files read as they are with `mysql`).
//!
//! ## What differs from PostgreSQL
//!
//! - **Fences** are microseconds of the server's clock, and at least one
//!   more than the stored fence: they rise per key across expiry, delete and
//!   purge, as long as the server's clock does not step back past a
//!   deleted record's fence (MySQL has no sequences; a counter row would be
//!   one lock every claim in the database waits on).
//! - **Waiting duplicates poll.** MySQL has no notifications, so a
//!   duplicate that waits for a record in progress reads its state, 5 ms
//!   doubling to 200 ms, until it ends or the wait does.
//! - **Purge** waits for a row a claim holds rather than skipping it.
//! - **Remembering expired keys**: a claim takes a transaction of its own
//!   (the record locked, the memory read, `idem_claim_row`, rolled back
//!   when the key is a late retry), not a batch; the purge reads a batch of
//!   expired records `FOR UPDATE`, remembers and deletes them in one
//!   transaction, the digest worked out in Rust (MySQL has no `DELETE …
//!   RETURNING`).

mod admin;
mod builder;
mod conn;
mod encode;
mod error;
mod horizon;
pub mod inbox;
mod many;
pub mod outbox;
mod schema;
mod sql;
mod steps;
mod store;

pub use builder::{
    redact_url, MySqlStoreBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_SIZE,
    DEFAULT_RESPONSE_TIMEOUT,
};
pub use error::ConnectError;
pub use schema::{migrations, Migration};
pub use store::MySqlStore;
