//! Keys remembered past their retention ([`idem::horizon`]) on MySQL:
//! the database's setting (`idem_settings`), the claim that refuses a late
//! retry, and the purge that remembers what it drops (migration 0006).
//!
//! The claim locks the key's record, weighs what the store holds and
//! remembers, and claims, in one transaction it rolls back when the
//! answer is `Forgotten` ([`MySqlStore::claim_remembering`]). The digest
//! is worked out here, not in SQL, with the engine's own functions.

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem::horizon::{self, Forgotten};
use idem::store::{ClaimOutcome, ClaimParams};
use idem::{RecordId, StoreError, Timestamp};
use mysql_async::prelude::Queryable;
use mysql_async::{Row, TxOpts, Value};

use crate::encode;
use crate::sql;
use crate::store::{claim_args, id_params, MySqlStore, CLAIM_ROUNDS};

/// The memory of one key (its digest packed), if it is remembered.
const REMEMBERED: &str = "SELECT fingerprint, day FROM idem_horizon WHERE digest = ?";

/// How many times a remembering claim runs its transaction again after
/// the server rolled it back for a deadlock or a lock wait.
const CONTENDED_RETRIES: usize = 12;

/// How many records one statement of the purge names at most.
const CHUNK: usize = 200;

/// How many bytes of ids (in hex) one statement of the purge carries at
/// most: far below the smallest `max_allowed_packet` a server is set to
/// (1 MiB), whatever the keys' length.
const CHUNK_BYTES: usize = 256 * 1024;

impl MySqlStore {
    /// How long the database remembers expired keys ([`idem::horizon`]),
    /// if at all: what `idem_settings` said when this store connected.
    pub fn remembers_expired(&self) -> Option<Duration> {
        let ms = self.inner.memory_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Writes `set` (if given; zero turns it off) as the database's memory
    /// of expired keys, then reads the database's setting. A database
    /// without the settings table (migrations applied by another tool, not
    /// yet 0006) does not remember, unless asked to, which is an error.
    pub(crate) async fn settle_memory(&self, set: Option<Duration>) -> Result<(), StoreError> {
        if let Some(memory) = set {
            let ms = i64::try_from(memory.as_millis()).unwrap_or(i64::MAX);
            self.write(
                "INSERT INTO idem_settings (name, value) VALUES ('remember_ms', ?) \
                 ON DUPLICATE KEY UPDATE value = VALUES(value)",
                vec![Value::Int(ms)],
            )
            .await?;
        }
        // Only a database without the table (not yet 0006) does not
        // remember: any other error is returned, or a purge would drop
        // expired records without remembering them.
        let ms = self
            .timed(async {
                let mut conn = self.inner.pool.get_conn().await?;
                match conn
                    .query_first::<i64, _>(
                        "SELECT value FROM idem_settings WHERE name = 'remember_ms'",
                    )
                    .await
                {
                    Ok(ms) => Ok(ms.unwrap_or(0)),
                    Err(mysql_async::Error::Server(e)) if e.code == 1146 => Ok(0),
                    Err(error) => Err(error),
                }
            })
            .await?;
        self.inner
            .memory_ms
            .store(u64::try_from(ms).unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    /// A claim on a database that remembers expired keys for `memory`,
    /// in one transaction: the key's record locked (`FOR UPDATE`, so a
    /// purge dropping it has committed its memory before this reads on),
    /// the claim (`idem_claim_row`), and, when it would start the key
    /// afresh (a new record: attempt 1), what the store held and what the
    /// memory holds weighed; a late retry is rolled back and answered
    /// `Forgotten`. A record the claim replaced was expired by the
    /// server's clock, whatever this process's clock says. Concurrent
    /// claims of a key with no record can deadlock on InnoDB's gap locks;
    /// the loser's transaction is rolled back whole and run again, after
    /// a few random milliseconds, up to [`CONTENDED_RETRIES`] times.
    pub(crate) async fn claim_remembering(
        &self,
        id: &RecordId,
        params: &ClaimParams,
        memory: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let digest = horizon::digest(id);
        let mut contended = 0;
        let mut rounds = 0;
        while rounds < CLAIM_ROUNDS {
            let token = self.inner.tokens.next();
            let decided = self
                .timed(async {
                    let mut conn = self.inner.pool.get_conn().await?;
                    // Before the transaction: MySQL with GTIDs refuses
                    // CREATE TEMPORARY TABLE inside one.
                    conn.query_drop("CALL idem_answers_ready()").await?;
                    let mut tx = conn.start_transaction(TxOpts::default()).await?;
                    let held: Vec<Row> = tx
                        .exec(&self.inner.sql.held_locked, id_params(id).to_vec())
                        .await?;
                    tx.exec_drop(sql::CLAIM_ROW, claim_args(id, params, token))
                        .await?;
                    let answers: Vec<Row> = tx.query("SELECT * FROM idem_answers").await?;
                    let outcome =
                        encode::claim_outcome(answers.first(), id, token, params.fingerprint);
                    let fresh = matches!(
                        &outcome,
                        Ok(Some(ClaimOutcome::Acquired(lease))) if lease.attempt == 1 && !lease.takeover
                    );
                    if !fresh {
                        tx.commit().await?;
                        return Ok(outcome);
                    }
                    let remembered: Vec<Row> = tx
                        .exec(REMEMBERED, vec![Value::Int(horizon::packed(&digest))])
                        .await?;
                    let remembered = remembered.first().and_then(|row| memory_at(row, digest));
                    match late_retry(id, held.first(), remembered, params, memory) {
                        Ok(None) => {
                            tx.commit().await?;
                            Ok(outcome)
                        }
                        Ok(Some(late)) => {
                            tx.rollback().await?;
                            Ok(Ok(Some(late)))
                        }
                        Err(error) => {
                            tx.rollback().await?;
                            Ok(Err(error))
                        }
                    }
                })
                .await;
            let decided = match decided {
                Err(error) if error.is_contention() && contended < CONTENDED_RETRIES => {
                    contended += 1;
                    let pause = rand::random_range(1..=5 * contended);
                    tokio::time::sleep(Duration::from_millis(pause as u64)).await;
                    continue;
                }
                other => other?,
            };
            rounds += 1;
            if let Some(outcome) = decided? {
                return Ok(outcome);
            }
        }
        Ok(ClaimOutcome::InProgress {
            retry_after: Duration::from_millis(10),
        })
    }

    /// The purge of a database that remembers for `memory`: at most
    /// `limit` expired records, oldest first, locked, remembered and
    /// deleted in one transaction; then the days past the memory, a batch
    /// at a time. The number of records deleted.
    pub(crate) async fn purge_remembering(
        &self,
        limit: usize,
        memory: Duration,
    ) -> Result<usize, StoreError> {
        let first_day = horizon::first_kept_day(Timestamp::now(), memory);
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        self.timed(async {
            let mut conn = self.inner.pool.get_conn().await?;
            let mut tx = conn.start_transaction(TxOpts::default()).await?;
            let rows: Vec<Row> = tx.exec(&self.inner.sql.purge_take, (limit,)).await?;
            let mut purged = 0;
            for chunk in chunks(&rows) {
                let memories: Vec<String> = chunk
                    .iter()
                    .filter_map(memory_of)
                    .map(|m| {
                        format!(
                            "({}, {}, {})",
                            horizon::packed(&m.digest),
                            horizon::packed(&m.fingerprint),
                            m.day
                        )
                    })
                    .collect();
                if !memories.is_empty() {
                    tx.query_drop(format!(
                        "INSERT INTO idem_horizon (digest, fingerprint, day) VALUES {} \
                         ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), day = VALUES(day)",
                        memories.join(", ")
                    ))
                    .await?;
                }
                let ids: Vec<String> = chunk
                    .iter()
                    .map(|row| {
                        format!(
                            "(x'{}', x'{}')",
                            hex::encode(column_bytes(row, "scope")),
                            hex::encode(column_bytes(row, "key"))
                        )
                    })
                    .collect();
                tx.query_drop(format!(
                    "DELETE FROM idem_records WHERE (scope, `key`) IN ({})",
                    ids.join(", ")
                ))
                .await?;
                purged += tx.affected_rows();
            }
            tx.exec_drop(
                "DELETE FROM idem_horizon WHERE day < ? LIMIT ?",
                (first_day, limit),
            )
            .await?;
            tx.commit().await?;
            Ok(usize::try_from(purged).unwrap_or(usize::MAX))
        })
        .await
    }
}

/// [`horizon::late_retry`] for a claim that started `id` afresh, over
/// the record it held before (`held`, read under the claim's lock) and
/// what the memory holds. A held record the claim replaced was expired
/// by the server's clock, so it is weighed at its expiry at the latest.
fn late_retry(
    id: &RecordId,
    held: Option<&Row>,
    remembered: Option<Forgotten>,
    params: &ClaimParams,
    memory: Duration,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let held = held
        .map(|row| encode::record(row).map(|(_, record)| record))
        .transpose()?;
    let now = held
        .as_ref()
        .map_or(Timestamp::now(), |h| h.expires_at.max(Timestamp::now()));
    Ok(horizon::late_retry(
        id,
        held.as_ref(),
        remembered.as_ref(),
        params,
        now,
        memory,
    ))
}

/// The memory of the key whose digest is `digest`, from its
/// `idem_horizon` row (fingerprint, day).
fn memory_at(row: &Row, digest: horizon::IdDigest) -> Option<Forgotten> {
    let fingerprint = encode::int_at(row, 0)?;
    let day = u32::try_from(encode::int_at(row, 1)?).ok()?;
    Some(Forgotten {
        digest,
        fingerprint: fingerprint.to_be_bytes(),
        day,
    })
}

/// `rows` in runs of at most [`CHUNK`] records and [`CHUNK_BYTES`] of
/// ids in hex (each run has at least one record).
fn chunks(rows: &[Row]) -> Vec<&[Row]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, row) in rows.iter().enumerate() {
        let size = 2 * (column_bytes(row, "scope").len() + column_bytes(row, "key").len()) + 16;
        if i > start && (i - start == CHUNK || bytes + size > CHUNK_BYTES) {
            out.push(&rows[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < rows.len() {
        out.push(&rows[start..]);
    }
    out
}

/// The bytes of `column` in `row` (empty when absent or not bytes).
fn column_bytes<'a>(row: &'a Row, column: &str) -> &'a [u8] {
    match encode::value(row, column) {
        Value::Bytes(bytes) => bytes,
        _ => &[],
    }
}

/// What to remember of a record the purge drops (`sql/purge_take.sql`'s
/// row): a completed or failed record of a remembered scope; nothing for
/// the rest, nor for a row that does not read (it is dropped all the same).
fn memory_of(row: &Row) -> Option<Forgotten> {
    let scope = std::str::from_utf8(column_bytes(row, "scope")).ok()?;
    let key = std::str::from_utf8(column_bytes(row, "key")).ok()?;
    let state = column_bytes(row, "state");
    if !horizon::remembered_scope(scope) || !matches!(state, b"completed" | b"failed") {
        return None;
    }
    let fingerprint = match encode::value(row, "fingerprint") {
        Value::Bytes(bytes) => Some(bytes.as_slice()),
        _ => None,
    };
    let expires_at = u64::try_from(encode::int_at(row, 4)?).ok()?;
    Some(Forgotten {
        digest: horizon::digest_of(scope, key),
        fingerprint: horizon::fingerprint_prefix_of(fingerprint),
        day: horizon::day_of(Timestamp::from_millis(expires_at)),
    })
}
