//! The file's memory of expired keys ([`idem::horizon`]): the
//! `idem_horizon` table (migration 0004), written by the purge in the
//! transaction that deletes the records, read by claims that would start a
//! key afresh, and dropped a day at a time through its day index.

use std::time::Duration;

use idem::horizon::{self, FingerprintPrefix, Forgotten, IdDigest};
use idem::{RecordId, Timestamp};
use rusqlite::{params, Connection, OptionalExtension};

use crate::encode;
use crate::expiry;

/// What the file remembers of `id`, if anything (whatever its day: the
/// caller weighs it against the memory).
pub(crate) fn recall(conn: &Connection, id: &RecordId) -> rusqlite::Result<Option<Forgotten>> {
    let digest = horizon::digest(id);
    conn.prepare_cached("SELECT fingerprint, day FROM idem_horizon WHERE digest = ?1")?
        .query_row([horizon::packed(&digest)], |row| {
            let fingerprint: i64 = row.get(0)?;
            let day: i64 = row.get(1)?;
            Ok((fingerprint, day))
        })
        .optional()
        .map(|found| {
            found.and_then(|(fingerprint, day)| {
                Some(Forgotten {
                    digest,
                    fingerprint: fingerprint.to_be_bytes(),
                    day: u32::try_from(day).ok()?,
                })
            })
        })
}

/// Deletes up to `limit` expired records, remembering the ones that ended
/// (completed or failed), and drops up to `limit` remembered keys of the
/// days older than `memory`. Returns
/// how many records were deleted. Only the columns the memory keeps are
/// read (not the responses).
pub(crate) fn purge_remembering(
    tx: &Connection,
    limit: usize,
    now: Timestamp,
    memory: Duration,
) -> rusqlite::Result<usize> {
    let mut expired = tx.prepare_cached(concat!(
        "SELECT rowid, scope, key, state, fingerprint, expires_at FROM idem_records ",
        expiry::ended!()
    ))?;
    let mut remember = tx.prepare_cached(
        "INSERT OR REPLACE INTO idem_horizon (digest, fingerprint, day) VALUES (?1, ?2, ?3)",
    )?;
    let mut delete = tx.prepare_cached("DELETE FROM idem_records WHERE rowid = ?1")?;
    // Read first, then write: rows are not changed under an open read.
    let found = expired
        .query_map(
            params![
                encode::millis(now),
                i64::try_from(limit).unwrap_or(i64::MAX)
            ],
            |row| {
                let rowid: i64 = row.get(0)?;
                // A row that cannot be read is deleted, not remembered (it
                // could not be replayed either), and never stops the purge.
                Ok((rowid, remembered_entry(row)))
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (rowid, entry) in &found {
        if let Some((digest, fingerprint, day)) = entry {
            remember.execute(params![
                horizon::packed(digest),
                horizon::packed(fingerprint),
                i64::from(*day)
            ])?;
        }
        delete.execute([rowid])?;
    }
    // Claims abandoned past their retention never ended: nothing of them
    // is remembered.
    let deleted =
        found.len() + expiry::delete_abandoned(tx, now, limit.saturating_sub(found.len()))?;
    // Days past the memory go a batch at a time too, so no purge holds
    // the writer for a whole day's keys.
    tx.prepare_cached(
        "DELETE FROM idem_horizon WHERE digest IN \
         (SELECT digest FROM idem_horizon WHERE day < ?1 LIMIT ?2)",
    )?
    .execute(params![
        i64::from(horizon::first_kept_day(now, memory)),
        i64::try_from(limit).unwrap_or(i64::MAX)
    ])?;
    Ok(deleted)
}

/// What to remember of an expired row (`rowid, scope, key, state,
/// fingerprint, expires_at`): its digest, fingerprint prefix and day, if
/// it ended, in a remembered scope, and reads.
fn remembered_entry(row: &rusqlite::Row<'_>) -> Option<(IdDigest, FingerprintPrefix, u32)> {
    let ended = row.get::<_, i64>(3).ok().is_some_and(encode::ended);
    let scope = row.get_ref(1).ok()?.as_str().ok()?;
    if !ended || !horizon::remembered_scope(scope) {
        return None;
    }
    let key = row.get_ref(2).ok()?.as_str().ok()?;
    let fingerprint = row.get_ref(4).ok()?.as_blob_or_null().ok()?;
    let expires_at: i64 = row.get(5).ok()?;
    Some((
        horizon::digest_of(scope, key),
        horizon::fingerprint_prefix_of(fingerprint),
        horizon::day_of(Timestamp::from_millis(expires_at.unsigned_abs())),
    ))
}

/// How many keys the file remembers.
pub(crate) fn remembered(conn: &Connection) -> rusqlite::Result<u64> {
    let count: i64 = conn.query_row("SELECT count(*) FROM idem_horizon", [], |r| r.get(0))?;
    Ok(count.unsigned_abs())
}
