//! The writer's memory of the records it has just claimed.
//!
//! A run's completion (and each of its extensions and steps) must read its
//! record before the machine decides the write: the lease may have been
//! lost. Most of the time that record is the one this very connection
//! wrote a moment before, when it claimed the key, so the writer keeps the
//! in-progress records it wrote, with their rowids, and the write that
//! follows takes the record from here instead of the file (the read was
//! 6 % of the gateway's CPU with unique keys).
//!
//! What is kept is always what the file holds: an entry is dropped by
//! every write of this connection that does not leave the record in
//! progress as kept (a completion takes it, a delete or a resolution
//! forgets it, a purge forgets them all), and all of them are dropped when
//! another connection (another process, another store on the file, an
//! inbox's transaction) has committed since this one last looked —
//! `PRAGMA data_version`, read after `BEGIN IMMEDIATE`, when no other
//! connection can write until this one commits — and when a transaction
//! does not commit.
//!
//! Beside the records, it keeps whether the file's memory of expired keys
//! (`idem_horizon`) is empty, so that a claim does not look there for a
//! key while there is nothing to find (the digest and the lookup were 4 %
//! of a unique key's instructions). Only a purge of this connection writes
//! that table; it drops what is known as it drops the records, and so do
//! another connection's commit and a transaction that does not commit.

use std::collections::HashMap;

use idem::{Record, RecordId};
use rusqlite::Connection;

/// At most this many records are kept; past it the memory starts over
/// (records of runs that never ended would otherwise stay).
const CAPACITY: usize = 4096;

/// In-progress records this connection wrote, by key, with their rowids.
#[derive(Default)]
pub(crate) struct Recent {
    rows: HashMap<RecordId, (i64, Record)>,
    /// The file's `data_version` as this connection last read it.
    version: Option<i64>,
    /// Whether `idem_horizon` was empty when this connection last looked.
    horizon_empty: Option<bool>,
}

impl Recent {
    /// Forgets everything if another connection committed since the last
    /// call. Call it inside the transaction, after `BEGIN IMMEDIATE`.
    pub(crate) fn check(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        let version = conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get::<_, i64>(0))?;
        if self.version != Some(version) {
            self.clear();
            self.version = Some(version);
        }
        Ok(())
    }

    /// Whether the file remembers no expired key, read from the file only
    /// when not known since the last drop. Call it inside the transaction.
    pub(crate) fn horizon_empty(&mut self, conn: &Connection) -> rusqlite::Result<bool> {
        if let Some(empty) = self.horizon_empty {
            return Ok(empty);
        }
        let empty = conn
            .prepare_cached("SELECT NOT EXISTS (SELECT 1 FROM idem_horizon)")?
            .query_row([], |r| r.get::<_, bool>(0))?;
        self.horizon_empty = Some(empty);
        Ok(empty)
    }

    /// The record of `id` as this connection last wrote it, if kept; it is
    /// no longer kept.
    pub(crate) fn take(&mut self, id: &RecordId) -> Option<(i64, Record)> {
        self.rows.remove(id)
    }

    /// The record of `id` as this connection last wrote it, if kept.
    pub(crate) fn get(&self, id: &RecordId) -> Option<&Record> {
        self.rows.get(id).map(|(_, record)| record)
    }

    /// Keeps `record`, just written to row `rowid` for `id`.
    pub(crate) fn keep(&mut self, id: &RecordId, rowid: i64, record: Record) {
        if self.rows.len() >= CAPACITY {
            self.rows.clear();
        }
        self.rows.insert(id.clone(), (rowid, record));
    }

    /// Drops what is kept for `id`.
    pub(crate) fn forget(&mut self, id: &RecordId) {
        self.rows.remove(id);
    }

    /// Drops everything, and what is known of the memory of expired keys.
    pub(crate) fn clear(&mut self) {
        self.rows.clear();
        self.horizon_empty = None;
    }
}
