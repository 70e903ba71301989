//! # idem-sqlite: the embedded durable store
//!
//! The zero-server default for idem: one SQLite file in WAL mode. A
//! completion returned to the caller is on disk (fsynced) by default, and
//! concurrent callers share fsyncs: a single writer thread batches whatever
//! is queued into one transaction (group commit). Reads — and claims that
//! only find an outcome — are served from their own connections without
//! waiting for the writer. Several processes may share one file.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use idem::{Idempotency, Outcome, RecordId};
//! use idem_sqlite::SqliteStore;
//!
//! let dir = tempfile::tempdir()?;
//! let store = SqliteStore::open(dir.path().join("idem.db"))?;
//! let idem = Idempotency::builder(store).build()?;
//! let id = RecordId::parse("emails", "welcome:user-42")?;
//! let sent = idem.run(&id, None, |_| async { Ok::<_, std::io::Error>("sent".to_owned()) }).await?;
//! assert!(matches!(sent, Outcome::Executed { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! - **Durability:** [`Durability::Full`] by default (the log fsynced
//!   before every answer, by a thread of its own while the writer commits
//!   the next batch, if one waits); [`Durability::Normal`] trades the last
//!   acknowledged writes on an OS crash or power loss for speed (never on a
//!   process crash), as its docs say exactly.
//! - **Atomicity:** every primitive runs inside the writer's `BEGIN
//!   IMMEDIATE` transaction, deciding with `idem::machine` against the rows
//!   as that transaction sees them; other processes are excluded by
//!   SQLite's write lock (they wait up to the busy timeout).
//! - **Tokens and fences** come from a sequence kept in the file, so they
//!   are unique and rising for the life of the file, across processes and
//!   restarts.
//! - **Clocks:** leases are decided on the wall clock of the process that
//!   writes. A clock that jumps (or processes whose clocks disagree) makes
//!   leases end early or late — a takeover sooner than the lease, or a
//!   crashed worker's key waiting longer — but never lets a stale holder's
//!   completion through: that is decided by token and fence, not by time
//!   (`RELIABILITY.md`, `sqlite-lease` with clock jumps of up to three
//!   leases).
//! - **Threads:** concurrent writes are batched by one writer thread per
//!   store. A write with nothing else in flight, while no two writes have
//!   overlapped for a tenth of a second, on a multi-threaded tokio runtime
//!   with more than one worker, commits on the caller's thread instead
//!   (saving two thread wake-ups; it waits up to the busy timeout if
//!   another process holds the write lock). Under load every write goes
//!   to the writer, so that they share commits. Reads (`get`, `list`, the first look of a `claim`)
//!   are short indexed lookups on the caller's thread. Dropping the last
//!   clone waits for the writer's current batch, so nothing acknowledged
//!   is lost.
//! - **Transactional inbox:** [`inbox::Inbox`] writes the dedup record
//!   inside your own `rusqlite` transaction.
//! - **Transactional outbox:** [`outbox::Outbox`] enqueues messages inside
//!   your own `rusqlite` transaction, and its dispatcher sends them once
//!   that transaction committed.

mod admin;
mod builder;
mod durable;
mod encode;
mod errors;
mod expiry;
mod horizon;
pub mod inbox;
mod jobs;
mod many;
pub mod outbox;
mod peek;
mod recent;
mod schema;
mod steps;
mod store;
mod syncer;
mod traffic;
mod writer;

pub use builder::{SqliteStoreBuilder, DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_QUEUE};
pub use schema::{migrations, Durability, Migration, OpenError, SCHEMA_VERSION};
pub use store::SqliteStore;
