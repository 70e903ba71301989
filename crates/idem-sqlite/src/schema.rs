//! Opening a store file: pragmas, schema migrations (`migrations/*.sql`),
//! and the clear errors for files that cannot be used.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

/// One schema migration, applied in order of `version`.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The schema version this migration brings the file to.
    pub version: u32,
    /// The file it came from.
    pub name: &'static str,
    /// Its SQL.
    pub sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_records.sql",
        sql: include_str!("../migrations/0001_records.sql"),
    },
    Migration {
        version: 2,
        name: "0002_steps.sql",
        sql: include_str!("../migrations/0002_steps.sql"),
    },
    Migration {
        version: 3,
        name: "0003_abandoned.sql",
        sql: include_str!("../migrations/0003_abandoned.sql"),
    },
    Migration {
        version: 4,
        name: "0004_horizon.sql",
        sql: include_str!("../migrations/0004_horizon.sql"),
    },
    Migration {
        version: 5,
        name: "0005_expiry_of_ended.sql",
        sql: include_str!("../migrations/0005_expiry_of_ended.sql"),
    },
];

/// The schema version this build writes (SQLite's `user_version`).
pub const SCHEMA_VERSION: u32 = 5;

/// The store's migrations, oldest first.
pub fn migrations() -> &'static [Migration] {
    MIGRATIONS
}

/// How much a returned write is worth after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// The default: the write-ahead log is fsynced before any answer is
    /// returned, so an acknowledged completion survives a process crash,
    /// an OS crash and a power loss. The fsync is the store's, not the
    /// commit's: the writer runs at `synchronous=NORMAL`, and when another
    /// batch waits it commits that batch while a syncer thread syncs the
    /// last; reads wait until what they saw is synced. (If the log cannot
    /// be opened to be synced, the writer stays at `synchronous=FULL`.)
    #[default]
    Full,
    /// `synchronous=NORMAL`: the log reaches the operating system before the
    /// answer is returned but is fsynced only at checkpoints. An
    /// acknowledged write survives a crash of the process; an OS crash or
    /// power loss can roll back the most recent acknowledged writes (never
    /// corrupting the file). After such a rollback a completed key can run
    /// again. Several times faster when callers are few.
    Normal,
}

/// Why a store file could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The file (or its directory, which holds the `-wal` and `-shm` files)
    /// cannot be created or written.
    #[error(
        "cannot open {path} for reading and writing (the file and its directory must be writable)"
    )]
    Unwritable {
        /// The path given.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The file exists but is not a SQLite database (or is damaged beyond
    /// reading its header).
    #[error("{path} is not a SQLite database, or is corrupt")]
    NotADatabase {
        /// The path given.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The file was written by a newer idem with a schema this build does
    /// not know.
    #[error("{path} has idem schema version {found}; this build supports up to {supported}: upgrade idem-sqlite")]
    FutureSchema {
        /// The path given.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The newest version this build knows.
        supported: u32,
    },
    /// Another process held the file's write lock for longer than the busy
    /// timeout.
    #[error("{path} stayed locked by another connection for more than {waited:?}")]
    Locked {
        /// The path given.
        path: PathBuf,
        /// The busy timeout.
        waited: Duration,
    },
    /// Any other SQLite error while opening.
    #[error("SQLite error while opening {path}")]
    Sqlite {
        /// The path given.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
}

impl OpenError {
    fn classify(path: &Path, busy: Duration, source: rusqlite::Error) -> Self {
        let path = path.to_path_buf();
        match source.sqlite_error_code() {
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
                Self::NotADatabase { path, source }
            }
            Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => {
                Self::Unwritable { path, source }
            }
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                Self::Locked { path, waited: busy }
            }
            _ => Self::Sqlite { path, source },
        }
    }
}

/// What a connection is for, which sets its page cache.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Role {
    /// The one writing connection: a page cache big enough for the hot part
    /// of a large table's B-trees (the default 2 MiB turns every miss into
    /// a read system call).
    Writer,
    /// A pooled reading connection doing point lookups: a small cache, as
    /// there may be one per concurrent reader.
    Reader,
}

impl Role {
    fn cache_kib(self) -> i64 {
        match self {
            Role::Writer => 64 * 1024,
            Role::Reader => 4 * 1024,
        }
    }
}

/// Opens a connection with the store's pragmas.
pub(crate) fn connect(
    path: &Path,
    durability: Durability,
    busy: Duration,
    role: Role,
) -> Result<Connection, OpenError> {
    let fail = |e| OpenError::classify(path, busy, e);
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(fail)?;
    conn.busy_timeout(busy).map_err(fail)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(fail)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::Sqlite {
            path: path.to_path_buf(),
            source: rusqlite::Error::InvalidParameterName(format!("journal_mode stayed {mode}")),
        });
    }
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)
        .map_err(fail)?;
    conn.pragma_update(None, "cache_size", -role.cache_kib())
        .map_err(fail)?;
    if let Role::Reader = role {
        conn.pragma_update(None, "query_only", true).map_err(fail)?;
    }
    Ok(conn)
}

/// Runs `step` again while SQLite answers busy or locked, until `busy` has
/// passed. A connection that meets another one turning a new file to WAL,
/// or recovering its WAL, is told busy at once, without its busy handler
/// (SQLite does not wait where waiting could deadlock): processes started
/// together on a new file would otherwise fail to open it.
pub(crate) fn retry_busy<T>(
    busy: Duration,
    mut step: impl FnMut() -> Result<T, OpenError>,
) -> Result<T, OpenError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        match step() {
            Err(OpenError::Locked { .. }) if started.elapsed() + pause < busy => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// How long the file remembers expired keys: `set` written first if given
/// (zero: not at all), else what the file says; `None` for not at all.
pub(crate) fn memory(
    conn: &Connection,
    path: &Path,
    busy: Duration,
    set: Option<Duration>,
) -> Result<Option<Duration>, OpenError> {
    let fail = |e| OpenError::classify(path, busy, e);
    if let Some(memory) = set {
        let ms = i64::try_from(memory.as_millis()).unwrap_or(i64::MAX);
        conn.execute(
            "INSERT OR REPLACE INTO idem_meta (name, value) VALUES ('remember_ms', ?1)",
            [ms],
        )
        .map_err(fail)?;
    }
    let ms: Option<i64> = conn
        .query_row(
            "SELECT value FROM idem_meta WHERE name = 'remember_ms'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(fail)?;
    Ok(ms
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis))
}

/// Brings the file to [`SCHEMA_VERSION`] and returns the store's id.
pub(crate) fn migrate(
    conn: &mut Connection,
    path: &Path,
    busy: Duration,
) -> Result<u64, OpenError> {
    let fail = |e| OpenError::classify(path, busy, e);
    let version = |conn: &Connection| -> Result<u32, OpenError> {
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(fail)?;
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    };
    let check = |found: u32| {
        if found > SCHEMA_VERSION {
            Err(OpenError::FutureSchema {
                path: path.to_path_buf(),
                found,
                supported: SCHEMA_VERSION,
            })
        } else {
            Ok(())
        }
    };
    check(version(conn)?)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail)?;
    let found = version(&tx)?;
    check(found)?;
    for m in MIGRATIONS.iter().filter(|m| m.version > found) {
        tx.execute_batch(m.sql).map_err(fail)?;
        tx.pragma_update(None, "user_version", m.version)
            .map_err(fail)?;
        tracing::info!(migration = m.name, "applied idem-sqlite migration");
    }
    tx.execute(
        "INSERT OR IGNORE INTO idem_meta (name, value) VALUES ('store_id', ?1), ('seq', 0)",
        [rand::random::<i64>()],
    )
    .map_err(fail)?;
    let id: i64 = tx
        .query_row(
            "SELECT value FROM idem_meta WHERE name = 'store_id'",
            [],
            |r| r.get(0),
        )
        .map_err(fail)?;
    tx.commit().map_err(fail)?;
    Ok(id as u64)
}
