//! The file's memory of expired keys ([`idem::horizon`]): the
//! `idem_horizon` table (migration 0004), written by the purge in the
//! transaction that deletes the records, read by claims that would start a
//! key afresh, and dropped a day at a time through its day index.

use std::time::Duration;

use idem::horizon::{self, Forgotten};
use idem::{RecordId, Scope, Timestamp};
use rusqlite::{params, Connection, OptionalExtension};

use crate::encode::{self, columns};

/// What the file remembers of `id`, if anything (whatever its day: the
/// caller weighs it against the memory).
pub(crate) fn recall(conn: &Connection, id: &RecordId) -> rusqlite::Result<Option<Forgotten>> {
    let digest = horizon::digest(id);
    conn.prepare_cached("SELECT fingerprint, day FROM idem_horizon WHERE digest = ?1")?
        .query_row([&digest[..]], |row| {
            let fingerprint: Vec<u8> = row.get(0)?;
            let day: i64 = row.get(1)?;
            Ok((fingerprint, day))
        })
        .optional()
        .map(|found| {
            found.and_then(|(fingerprint, day)| {
                Some(Forgotten {
                    digest,
                    fingerprint: fingerprint.try_into().ok()?,
                    day: u32::try_from(day).ok()?,
                })
            })
        })
}

/// Deletes up to `limit` expired records, remembering the ones that ended
/// (completed or failed), and drops the days older than `memory`. Returns
/// how many records were deleted. A row that cannot be read is deleted
/// without being remembered (it could not be replayed either).
pub(crate) fn purge_remembering(
    tx: &Connection,
    limit: usize,
    now: Timestamp,
    memory: Duration,
) -> rusqlite::Result<usize> {
    const EXPIRED: &str = concat!(
        "SELECT rowid, scope, key, ",
        columns!(),
        " FROM idem_records WHERE expires_at <= ?1 LIMIT ?2"
    );
    let expired = tx
        .prepare_cached(EXPIRED)?
        .query_map(
            params![
                encode::millis(now),
                i64::try_from(limit).unwrap_or(i64::MAX)
            ],
            |row| {
                let scope: String = row.get(1)?;
                let key: String = row.get(2)?;
                Ok((row.get::<_, i64>(0)?, scope, key, encode::decode(row, 3)))
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut remember = tx.prepare_cached(
        "INSERT OR REPLACE INTO idem_horizon (digest, fingerprint, day) VALUES (?1, ?2, ?3)",
    )?;
    let mut delete = tx.prepare_cached("DELETE FROM idem_records WHERE rowid = ?1")?;
    for (rowid, scope, key, record) in &expired {
        let id = Scope::new(scope).ok().and_then(|s| {
            Some(RecordId::new(
                s,
                encode::stored_key_rules().parse(key).ok()?,
            ))
        });
        let entry = id
            .zip(record.as_ref().ok())
            .and_then(|(id, record)| Forgotten::of(&id, record));
        if let Some(entry) = entry {
            remember.execute(params![
                &entry.digest[..],
                &entry.fingerprint[..],
                i64::from(entry.day)
            ])?;
        }
        delete.execute([rowid])?;
    }
    tx.prepare_cached("DELETE FROM idem_horizon WHERE day < ?1")?
        .execute([i64::from(horizon::first_kept_day(now, memory))])?;
    Ok(expired.len())
}

/// How many keys the file remembers.
pub(crate) fn remembered(conn: &Connection) -> rusqlite::Result<u64> {
    let count: i64 = conn.query_row("SELECT count(*) FROM idem_horizon", [], |r| r.get(0))?;
    Ok(count.unsigned_abs())
}
