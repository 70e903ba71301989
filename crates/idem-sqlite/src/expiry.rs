//! Finding expired records for the purge.
//!
//! The expiry index holds only records that are no longer in progress
//! (migration 0005): a claim does not enter it, and a completion enters it
//! once instead of moving an entry the claim made. A record still in
//! progress expires only when it was abandoned for longer than its
//! retention; those are found through the abandoned-claims index, which
//! holds exactly the in-progress records.

use idem::Timestamp;
use rusqlite::{params, Connection};

use crate::encode;

/// The clause that picks up to `?2` records no longer in progress that
/// expired by `?1`, through the expiry index (a macro so SQL text can be
/// built at compile time).
macro_rules! ended {
    () => {
        "WHERE state <> 0 AND expires_at <= ?1 LIMIT ?2"
    };
}
pub(crate) use ended;

/// The clause that picks up to `?2` in-progress records that expired by
/// `?1`, through the abandoned-claims index. That index is ordered by
/// scope, so the whole of it is read; but an in-progress record never
/// expires before its lease ends (`decide_claim` keeps a record at least
/// as long as its lease, a heartbeat moves both), so the lease, which the
/// index holds, rules out the runs still in flight without reading their
/// rows. A row without a lease (corrupt) is read.
macro_rules! abandoned {
    () => {
        "INDEXED BY idem_records_abandoned WHERE state = 0 \
         AND (lease_until <= ?1 OR lease_until IS NULL) AND expires_at <= ?1 LIMIT ?2"
    };
}

/// Deletes up to `limit` expired records, whatever their state; returns
/// how many.
pub(crate) fn delete(tx: &Connection, now: Timestamp, limit: usize) -> rusqlite::Result<usize> {
    const SQL: &str = concat!(
        "DELETE FROM idem_records WHERE rowid IN (SELECT rowid FROM idem_records ",
        ended!(),
        ")"
    );
    let ended = tx
        .prepare_cached(SQL)?
        .execute(params![encode::millis(now), count(limit)])?;
    Ok(ended + delete_abandoned(tx, now, limit.saturating_sub(ended))?)
}

/// Deletes up to `limit` expired records that are still in progress
/// (abandoned past their retention); returns how many.
pub(crate) fn delete_abandoned(
    tx: &Connection,
    now: Timestamp,
    limit: usize,
) -> rusqlite::Result<usize> {
    if limit == 0 {
        return Ok(0);
    }
    const SQL: &str = concat!(
        "DELETE FROM idem_records WHERE rowid IN (SELECT rowid FROM idem_records ",
        abandoned!(),
        ")"
    );
    tx.prepare_cached(SQL)?
        .execute(params![encode::millis(now), count(limit)])
}

fn count(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    fn plan(conn: &Connection, select: &str) -> String {
        conn.prepare(&format!("EXPLAIN QUERY PLAN {select}"))
            .expect("prepare")
            .query_map(rusqlite::params![0, 10], |r| r.get::<_, String>(3))
            .expect("explain")
            .collect::<rusqlite::Result<Vec<_>>>()
            .expect("rows")
            .join("; ")
    }

    #[test]
    fn the_ended_half_seeks_in_the_expiry_index_and_the_abandoned_half_reads_its_own() {
        let mut conn = Connection::open_in_memory().expect("open");
        let path = std::path::Path::new(":memory:");
        crate::schema::migrate(&mut conn, path, crate::DEFAULT_BUSY_TIMEOUT).expect("migrate");
        assert_eq!(
            plan(&conn, concat!("SELECT rowid FROM idem_records ", ended!())),
            "SEARCH idem_records USING INDEX idem_records_expires_at (expires_at<?)"
        );
        assert_eq!(
            plan(
                &conn,
                concat!("SELECT rowid FROM idem_records ", abandoned!())
            ),
            "SCAN idem_records USING INDEX idem_records_abandoned"
        );
    }
}
