//! SQLite's errors as the store contract's (`docs/design.md` §5.5): which
//! are transient, which are contention, which are the backend's, and a
//! row that cannot be read as a record.

use idem::{RecordId, StoreError};
use rusqlite::ErrorCode;

/// Maps a SQLite error to the store contract: lock waits and I/O trouble
/// are "unavailable" (the write may or may not have happened elsewhere;
/// the caller may retry), anything else is a backend error. A lock held
/// by another connection past the busy timeout is contention
/// ([`StoreError::contended`]): the file is there and another writer,
/// perhaps a duplicate of this very request in another process, holds it,
/// so fail-open must not run the work beside it.
pub(crate) fn store_error(e: &rusqlite::Error) -> StoreError {
    let message: idem::BoxError = format!("sqlite: {e}").into();
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::contended(message),
        Some(code) if transient(code) => StoreError::Unavailable(message),
        _ => StoreError::Backend(message),
    }
}

/// Whether a SQLite error code is transient (docs/design.md §5.5): the file
/// locked by another connection past the busy timeout (`SQLITE_BUSY`,
/// `SQLITE_LOCKED`), the disk full, an I/O error, or the file not opened;
/// the write was not applied, and a later try can succeed.
fn transient(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen
    )
}

/// A row of `id` that cannot be read as a record, and why.
pub(crate) fn corrupt(id: &RecordId, reason: String) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::ErrorCode;

    use super::transient;

    #[test]
    fn locks_a_full_disk_and_io_errors_are_transient_and_corruption_is_not() {
        for code in [
            ErrorCode::DatabaseBusy,
            ErrorCode::DatabaseLocked,
            ErrorCode::SystemIoFailure,
            ErrorCode::DiskFull,
            ErrorCode::CannotOpen,
        ] {
            assert!(transient(code), "{code:?}");
        }
        for code in [
            ErrorCode::DatabaseCorrupt,
            ErrorCode::NotADatabase,
            ErrorCode::ConstraintViolation,
            ErrorCode::TooBig,
            ErrorCode::ReadOnly,
        ] {
            assert!(!transient(code), "{code:?}");
        }
    }
}
