//! [`SqliteStoreBuilder`]: the defaults, and opening the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idem::{Clock, SystemClock};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};

use crate::durable::Durable;
use crate::peek::Peek;
use crate::recent::Recent;
use crate::schema::{self, Durability, OpenError, Role};
use crate::store::{Inner, SqliteStore};
use crate::traffic::Traffic;
use crate::writer::{Site, WriteConnection, Writer};

/// The default busy timeout: how long a connection waits for another
/// process's write lock before reporting the store unavailable.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The default largest number of jobs committed in one transaction.
pub const DEFAULT_MAX_BATCH: usize = 512;
/// The default number of jobs that may wait for the writer.
pub const DEFAULT_QUEUE: usize = 8192;

/// Configures and opens a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder<C: Clock = SystemClock> {
    path: PathBuf,
    clock: C,
    durability: Durability,
    busy: Duration,
    max_batch: usize,
    queue: usize,
    memory: Option<Duration>,
}

impl SqliteStore<SystemClock> {
    /// Opens (creating if needed) the store file at `path` with the
    /// defaults: full durability, 5 s busy timeout, the system clock.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        Self::builder(path).open()
    }

    /// A builder for the store file at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder<SystemClock> {
        SqliteStoreBuilder {
            path: path.as_ref().to_path_buf(),
            clock: SystemClock,
            durability: Durability::Full,
            busy: DEFAULT_BUSY_TIMEOUT,
            max_batch: DEFAULT_MAX_BATCH,
            queue: DEFAULT_QUEUE,
            memory: None,
        }
    }
}

impl<C: Clock> SqliteStoreBuilder<C> {
    /// Reads time from `clock` (a [`ManualClock`](idem::ManualClock) in
    /// tests). All processes sharing a file should use the same time source.
    pub fn clock<C2: Clock>(self, clock: C2) -> SqliteStoreBuilder<C2> {
        SqliteStoreBuilder {
            path: self.path,
            clock,
            durability: self.durability,
            busy: self.busy,
            max_batch: self.max_batch,
            queue: self.queue,
            memory: self.memory,
        }
    }

    /// What an acknowledged write survives (default [`Durability::Full`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How long to wait for another process's write lock.
    pub fn busy_timeout(mut self, busy: Duration) -> Self {
        self.busy = busy;
        self
    }

    /// The most jobs committed in one transaction (at least 1).
    pub fn max_batch(mut self, jobs: usize) -> Self {
        self.max_batch = jobs.max(1);
        self
    }

    /// How many jobs may wait for the writer before callers wait to
    /// enqueue (at least 1).
    pub fn queue(mut self, jobs: usize) -> Self {
        self.queue = jobs.max(1);
        self
    }

    /// Remembers the keys of completed and failed records for `memory`
    /// after the purge deletes them, so a late retry is answered
    /// [`Forgotten`](idem::store::ClaimOutcome::Forgotten) instead of run
    /// again ([`idem::horizon`]); zero turns it off. The setting is kept
    /// in the file: every process that opens it without saying (an
    /// `idem purge`, a second worker) remembers alike, and a file never
    /// told does not remember (a process reads the setting when it opens
    /// the file). Costs about 40 bytes of file per key,
    /// dropped a day at a time by the purge, and one index read more for
    /// a claim of a new key.
    pub fn remember_expired(mut self, memory: Duration) -> Self {
        self.memory = Some(memory);
        self
    }

    /// Opens the file, migrating its schema, and starts the writer.
    pub fn open(self) -> Result<SqliteStore<C>, OpenError> {
        let (conn, store_id, memory) = schema::retry_busy(self.busy, || {
            let mut conn = schema::connect(&self.path, self.durability, self.busy, Role::Writer)?;
            let store_id = schema::migrate(&mut conn, &self.path, self.busy)?;
            let memory = schema::memory(&conn, &self.path, self.busy, self.memory)?;
            Ok((conn, store_id, memory))
        })?;
        let durable = Arc::new(Durable::take_over(&conn, &self.path, self.durability));
        let (tx, rx) = mpsc::channel(self.queue);
        let clock = Arc::new(self.clock);
        let changed = Arc::new(Notify::new());
        let connection = Arc::new(Mutex::new(WriteConnection {
            conn,
            clock: Arc::clone(&clock),
            site: Site { store_id, memory },
            recent: Recent::default(),
        }));
        let writer = Writer {
            connection: Arc::clone(&connection),
            max_batch: self.max_batch,
            changed: Arc::clone(&changed),
            durable: Arc::clone(&durable),
        };
        let handle = std::thread::Builder::new()
            .name("idem-sqlite-writer".to_owned())
            .spawn(move || writer.run(rx))
            .map_err(|e| OpenError::Sqlite {
                path: self.path.clone(),
                source: rusqlite::Error::InvalidParameterName(format!(
                    "cannot start the writer thread: {e}"
                )),
            })?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                jobs: Some(tx),
                writer: Some(handle),
                connection,
                traffic: Traffic::new(),
                peek: Peek::default(),
                durable,
                readers: Mutex::new(Vec::new()),
                clock,
                changed,
                path: self.path,
                durability: self.durability,
                busy: self.busy,
            }),
        })
    }
}
