//! Removing blobs no record names, by the records' own retention: a blob
//! is kept while the record that wrote it is live at the fence that wrote
//! it (in progress, or completed with it), and removed once that record
//! expired, failed, was released or was taken over.

use std::time::{Duration, SystemTime};

use super::{BlobEntry, BlobError, BlobStore, Blobs};
use crate::purger::PurgerHandle;
use crate::record::State;
use crate::store::GetRecord;

/// How old a blob whose owner cannot be read (its header cut off by a
/// crash) must be before it is removed.
pub const UNOWNED_GRACE: Duration = Duration::from_secs(3600);

/// What one [`sweep`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Blobs looked at.
    pub checked: usize,
    /// Blobs removed.
    pub removed: usize,
    /// Where the next call starts; `None` after the last page.
    pub next: Option<String>,
}

/// Whether `entry` is still named, or may still be, by its record.
async fn wanted<S: GetRecord>(store: &S, entry: &BlobEntry) -> bool {
    let Some(owner) = &entry.owner else {
        let age = SystemTime::now()
            .duration_since(entry.modified)
            .unwrap_or_default();
        return age < UNOWNED_GRACE;
    };
    // An owner written under other key rules: kept, never guessed at.
    let Some(id) = owner.record_id() else {
        return true;
    };
    match store.get(&id).await {
        Ok(Some(record)) if record.fence == owner.fence => match record.state {
            State::InProgress { .. } => true,
            State::Completed { .. } => !entry.partial,
            _ => false,
        },
        Ok(_) => false,
        // The store is down: nothing is removed on a guess.
        Err(error) => {
            tracing::warn!(%error, locator = %entry.locator, "blob sweep could not read the blob's record; kept");
            true
        }
    }
}

/// Checks up to `batch` blobs after `after` against their records in
/// `store` and removes those no record names.
pub async fn sweep<S: GetRecord>(
    store: &S,
    blobs: &dyn BlobStore,
    after: Option<&str>,
    batch: usize,
) -> Result<Swept, BlobError> {
    let page = blobs.list(after, batch).await?;
    let mut swept = Swept {
        checked: page.entries.len(),
        next: page.next,
        ..Swept::default()
    };
    for entry in &page.entries {
        if !wanted(store, entry).await && blobs.delete(&entry.locator).await? {
            swept.removed += 1;
        }
    }
    metrics::counter!(crate::metrics::BLOBS_SWEPT).increment(swept.removed as u64);
    Ok(swept)
}

/// Starts a task on the current tokio runtime that, every `every`, walks
/// all of `blobs` `batch` at a time and removes those no record in `store`
/// names ([`sweep`]). Errors are logged and the walk starts over at the
/// next tick. Stops when the handle is dropped, as the record purger does.
pub fn spawn_blob_sweeper<S: GetRecord + Clone>(
    store: S,
    blobs: Blobs,
    every: Duration,
    batch: usize,
) -> PurgerHandle {
    let task = crate::purger::every(every, move || {
        let (store, blobs) = (store.clone(), blobs.clone());
        async move {
            let mut after: Option<String> = None;
            loop {
                match sweep(&store, blobs.store(), after.as_deref(), batch).await {
                    Ok(Swept {
                        next: Some(next), ..
                    }) => after = Some(next),
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(%error, "sweeping blobs failed; retrying at the next tick");
                        break;
                    }
                }
            }
        }
    });
    PurgerHandle::new(task)
}
