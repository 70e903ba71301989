//! The log's fsync, taken off the writer's path ([`Durability::Full`]).
//!
//! At `synchronous=FULL` SQLite fsyncs the write-ahead log inside each
//! `COMMIT`, so the writer waits out every fsync before it can begin its
//! next batch: while one batch is synced, none commits. Here the write
//! connection runs at `synchronous=NORMAL` instead, under which SQLite
//! still syncs the log's header when the log restarts, the log before each
//! checkpoint and the database after it (so the file is never corrupted),
//! and the store syncs the log itself. When another batch is queued, the
//! writer hands the last one to a syncer thread and commits the next; the
//! syncer fsyncs the log once for every batch committed before that fsync
//! began, then answers them. With nothing queued the writer fsyncs and
//! answers itself (a hand-off with nothing to overlap is only a wake-up
//! more). As at `FULL`, no answer is sent before an fsync that began after
//! its commit; unlike it, the next batch commits meanwhile.
//!
//! A commit is visible to readers before its fsync ends. So that nothing
//! this store reads can be taken back by a power loss, a read waits until
//! every commit begun before the read ended is synced ([`Durable::settled`]):
//! at once on a quiet store, for at most one fsync under load. (Another
//! process reading the file does not wait: it can see a write in the
//! millisecond before its fsync, as it could at `FULL` between SQLite's
//! write of the log and its fsync.)
//!
//! A failed fsync leaves the kernel free to have dropped the pages it could
//! not write, and a later fsync then succeeds without them. So after one
//! the store refuses every write and read as unavailable until it is
//! opened again; the batches that fsync covered are answered unavailable
//! (their writes are in the file, but not known to be on disk).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use idem::StoreError;
use rusqlite::Connection;
use tokio::sync::Notify;

use crate::schema::Durability;

/// Commits numbered as they begin, and how far the log is synced.
pub(crate) struct Durable {
    /// The write-ahead log, opened to be synced; `None` where SQLite syncs
    /// (or, at [`Durability::Normal`], nothing waits for a sync).
    log: Option<(PathBuf, File)>,
    /// The number of the last commit begun.
    begun: AtomicU64,
    /// Every commit numbered up to this one is synced.
    synced: AtomicU64,
    /// An fsync of the log failed.
    failed: AtomicBool,
    /// Told when `synced` or `failed` changes.
    moved: Notify,
}

impl Durable {
    /// Takes the log's fsync over from the write connection `conn` of the
    /// file at `db`, at [`Durability::Full`]. If the log cannot be opened
    /// (SQLite has not made it, or it is not a file this process may
    /// open), SQLite syncs it in each commit instead.
    pub(crate) fn take_over(conn: &Connection, db: &Path, durability: Durability) -> Self {
        let mut wal = db.as_os_str().to_owned();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let log = match durability {
            Durability::Normal => None,
            // Opened for writing too: some systems (Windows) sync only a
            // handle that may write.
            Durability::Full => match OpenOptions::new().read(true).write(true).open(&wal) {
                Ok(file) => match conn.pragma_update(None, "synchronous", "NORMAL") {
                    Ok(()) => Some((wal, file)),
                    Err(e) => {
                        tracing::warn!(error = %e, "idem-sqlite: the writer stays at synchronous=FULL");
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!(log = %wal.display(), error = %e, "idem-sqlite: the log cannot be opened to sync it; the writer stays at synchronous=FULL");
                    None
                }
            },
        };
        Self {
            log,
            begun: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            moved: Notify::new(),
        }
    }

    /// Whether committed batches wait for [`Self::sync`] to be answered.
    pub(crate) fn deferred(&self) -> bool {
        self.log.is_some()
    }

    /// Numbers a commit about to begin. Call it holding the write
    /// connection, before the transaction, so that commits are numbered in
    /// the order they become visible. Refused once an fsync has failed.
    pub(crate) fn begin(&self) -> Result<u64, StoreError> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(broken());
        }
        Ok(self.begun.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Syncs the log for every commit numbered up to `upto`, each of which
    /// has ended (committed or rolled back) before this call.
    pub(crate) fn sync(&self, upto: u64) -> Result<(), StoreError> {
        let Some((wal, log)) = &self.log else {
            return Ok(());
        };
        if self.failed.load(Ordering::SeqCst) {
            return Err(broken());
        }
        let result = log.sync_data();
        match result {
            Ok(()) => self.synced.fetch_max(upto, Ordering::SeqCst),
            Err(e) => {
                tracing::error!(log = %wal.display(), error = %e, "idem-sqlite: an fsync of the log failed; the store refuses every call until it is opened again");
                self.failed.store(true, Ordering::SeqCst);
                self.moved.notify_waiters();
                return Err(broken());
            }
        };
        self.moved.notify_waiters();
        Ok(())
    }

    /// Waits until every commit begun so far is synced, so that what the
    /// caller has just read cannot be taken back by a power loss.
    pub(crate) async fn settled(&self) -> Result<(), StoreError> {
        if self.log.is_none() {
            return Ok(());
        }
        let target = self.begun.load(Ordering::SeqCst);
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.failed.load(Ordering::SeqCst) {
                return Err(broken());
            }
            if self.synced.load(Ordering::SeqCst) >= target {
                return Ok(());
            }
            moved.await;
        }
    }
}

/// The answer of a store whose log's fsync failed.
pub(crate) fn broken() -> StoreError {
    StoreError::Unavailable(
        "idem-sqlite: an fsync of the log failed, so the last writes may not be on disk; open the store again"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn durable(log: &Path) -> Durable {
        Durable {
            log: Some((
                log.to_path_buf(),
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(log)
                    .expect("the log"),
            )),
            begun: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            moved: Notify::new(),
        }
    }

    async fn settles_within(durable: &Durable, wait: Duration) -> Option<Result<(), StoreError>> {
        tokio::time::timeout(wait, durable.settled()).await.ok()
    }

    #[tokio::test]
    async fn a_read_waits_for_the_fsync_of_every_commit_begun_before_it() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("idem.db-wal");
        std::fs::write(&log, b"frames").expect("write");
        let durable = durable(&log);
        let quiet = settles_within(&durable, Duration::ZERO).await;
        assert!(matches!(quiet, Some(Ok(()))), "nothing begun: {quiet:?}");
        let first = durable.begin().expect("begin");
        let second = durable.begin().expect("begin");
        assert!(settles_within(&durable, Duration::from_millis(50))
            .await
            .is_none());
        durable.sync(first).expect("sync");
        assert!(
            settles_within(&durable, Duration::from_millis(50))
                .await
                .is_none(),
            "the second commit is not synced yet"
        );
        let waiting = durable.settled();
        let syncing = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            durable.sync(second)
        };
        let (settled, synced) = tokio::join!(waiting, syncing);
        assert!(settled.is_ok() && synced.is_ok());
    }

    #[tokio::test]
    async fn after_a_failed_fsync_nothing_is_answered_until_the_store_is_opened_again() {
        // An fsync of /dev/null fails (EINVAL), as one of a failing disk does.
        let durable = durable(Path::new("/dev/null"));
        let number = durable.begin().expect("begin");
        let waiting = durable.settled();
        let (settled, synced) = tokio::join!(waiting, async { durable.sync(number) });
        assert!(
            matches!(synced, Err(StoreError::Unavailable(_))),
            "{synced:?}"
        );
        assert!(
            matches!(settled, Err(StoreError::Unavailable(_))),
            "{settled:?}"
        );
        assert!(durable.begin().is_err(), "a write after the failure");
        assert!(
            durable.sync(number + 1).is_err(),
            "a later fsync is not trusted"
        );
        assert!(matches!(
            settles_within(&durable, Duration::ZERO).await,
            Some(Err(StoreError::Unavailable(_)))
        ));
    }
}
