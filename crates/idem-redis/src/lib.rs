//! # idem-redis: the Redis store
//!
//! Keeps idem's records in Redis — one server or a Redis Cluster — with
//! every transition of the [store contract](idem::contract) done by one Lua
//! script on the server:
//!
//! - **Atomic and fenced.** `claim`, `complete`, `fail`, `extend` and
//!   `release` are each one Lua function run on the server (`lua/*.lua` in
//!   this crate). Writes check the holder's token inside the script, so a
//!   worker whose lease ran out can never overwrite the new holder's
//!   record, and nothing is read by the client and then written back.
//! - **Batched under load.** On a single server, calls made at the same
//!   time go together as one call of the batch script (group commit): the
//!   first call goes at once, those that arrive while it is out share the
//!   next. Each is still atomic and answered on its own; an error in one
//!   fails that call alone. A busy consumer pays one round trip and one
//!   script run for many messages instead of two each.
//!   [`RedisStoreBuilder::batching`] turns it off.
//! - **Compact records.** A record is one string: its fields and its
//!   response packed together, written with its expiry in one `SET`, so a
//!   claim makes two calls inside the script (a read and a write), and so
//!   does a completion. The step journal is a hash beside it, only for
//!   runs that journal steps. A record that cannot be read is reported as
//!   [`StoreError::Corrupt`](idem::StoreError::Corrupt) and left as it is. Records that builds before
//!   2026-11-26 kept as hashes are read as they are and turned into
//!   strings by their next write, so an upgrade needs no draining.
//! - **The server's clock.** Scripts read Redis `TIME`; no decision
//!   depends on client clocks agreeing.
//! - **Expiry at read time.** A record past its retention deadline is
//!   absent to every script whether or not Redis has dropped it yet. Redis
//!   drops it by itself a grace period later ([`DEFAULT_GRACE`]), so
//!   memory is reclaimed without a sweeper.
//! - **Cluster-ready.** A record's key (and its journal's) carries its own
//!   hash tag, so each script touches one slot and the same scripts run
//!   unchanged on a Cluster. No key is shared by all records: tokens are
//!   made by the client (a random per-store instance id and a counter) and
//!   fences rise per key from the record itself, or from the server clock
//!   in microseconds once the record is gone.
//! - **Waiters are woken, not polling.** A duplicate that waits for an
//!   in-flight run (`wait_for_in_flight`, HTTP `Prefer: wait`) subscribes
//!   to its record's channel (`<record key>:done`, carrying the hash tag,
//!   so it works on a Cluster too) and marks the record; the scripts that
//!   end a claim publish there when the record is marked, and only then.
//!   One pub/sub connection per store, opened on first wait; a read each
//!   second stays underneath as a safety net, and without pub/sub the wait
//!   polls.
//! - **Late retries refused, when asked.** With
//!   [`RedisStoreBuilder::remember_expired`], each record that ends leaves
//!   a small memory beside it that outlives it, and a retry that comes
//!   after the retention is answered `Forgotten` (HTTP 410) instead of
//!   running again ([`idem::horizon`]).
//! - **The outbox's pending index.** A run whose completion stores
//!   messages marks itself pending beside its record (`<record key>:o`,
//!   the same slot), in the completion's own script, and the mark is
//!   deleted once the messages are confirmed: one small write more than a
//!   run that sends nothing ([`idem::store::PendingSends`]). Dispatchers
//!   find the marks by scanning the scope, as the completer finds
//!   abandoned records.
//! - **Fails fast.** Connect and response timeouts are bounded, so a dead
//!   server is a [`StoreError::Unavailable`](idem::StoreError::Unavailable) within about a second, and the
//!   connection recovers on its own when the server returns.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Idempotency, RecordId};
//! use idem_redis::RedisStore;
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379/?namespace=payments").await?;
//! // or: RedisStore::connect("redis+cluster://127.0.0.1:7000,127.0.0.1:7001").await?
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
//! | URL | meaning |
//! |---|---|
//! | `redis://[user:password@]host:port[/db]` | one server (ACL user, database number) |
//! | `rediss://…` | the same over TLS (the `tls` feature) |
//! | `redis+cluster://[user:password@]host:port,host:port,…` | a Cluster, from any seed nodes |
//! | `rediss+cluster://…` | a Cluster over TLS |
//!
//! Query parameters: `namespace` (the key prefix, default `idem`),
//! `connect_timeout` and `response_timeout` (`500ms`, `2s`), `replicas`
//! and `replica_timeout` (writes wait for replicas:
//! [`RedisStoreBuilder::replica_acks`]), `remember` (`30d`: how long
//! expired keys are remembered, see
//! [`RedisStoreBuilder::remember_expired`]), and for TLS
//! `tls_ca_file` (a PEM file of roots to trust instead of the platform's);
//! others (such as `protocol=resp3`) go to the `redis` crate.
//!
#![doc = include_str!("../docs/persistence.md")]

mod admin;
mod builder;
mod cache;
mod call;
mod conn;
mod encode;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod group;
mod horizon;
mod many;
mod notify;
mod pending;
mod scripts;
mod shared;
mod steps;
mod store;

pub use builder::{
    redact_url, RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_GRACE, DEFAULT_NAMESPACE,
    DEFAULT_REPLICA_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT,
};
pub use cache::RedisReplayCache;
pub use error::ConnectError;
pub use store::RedisStore;

#[doc(hidden)]
pub use scripts::pair_functions;
