//! Records to and from rows of `idem_records`.

use bytes::Bytes;
use idem::store::LeaseToken;
use idem::{
    Failure, FailureClass, Fingerprint, KeyRules, Record, RecordId, State, StateKind, StepEntry,
    StepState, Timestamp,
};
use rusqlite::types::ToSql;
use rusqlite::types::Value;
use rusqlite::{params, CachedStatement, Connection, OptionalExtension, Row};

/// The columns [`decode`] reads, in order (a macro so SQL text can be
/// built at compile time).
macro_rules! columns {
    () => {
        "state, token, lease_until, response, failure_class, failure_msg, \
         fingerprint, attempt, fence, created_at, updated_at, expires_at"
    };
}
pub(crate) use columns;

const IN_PROGRESS: i64 = 0;
const COMPLETED: i64 = 1;
const FAILED: i64 = 2;
const RELEASED: i64 = 3;

/// Whether a row's state code is one that ended (completed or failed).
pub(crate) fn ended(code: i64) -> bool {
    code == COMPLETED || code == FAILED
}

pub(crate) fn state_code(kind: StateKind) -> i64 {
    match kind {
        StateKind::InProgress => IN_PROGRESS,
        StateKind::Completed => COMPLETED,
        StateKind::Failed => FAILED,
        StateKind::Released => RELEASED,
    }
}

/// Milliseconds as SQLite's signed 64-bit integer; "forever" saturates.
pub(crate) fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

fn timestamp(ms: i64) -> Result<Timestamp, String> {
    u64::try_from(ms)
        .map(Timestamp::from_millis)
        .map_err(|_| format!("negative time {ms}"))
}

/// Reads a record whose columns start at `offset` (in [`COLUMNS`] order).
/// Anything out of shape is reported, never guessed at.
pub(crate) fn decode(row: &Row<'_>, offset: usize) -> Result<Record, String> {
    let col = |i: usize| -> Result<Value, String> {
        row.get::<_, Value>(offset + i).map_err(|e| e.to_string())
    };
    let int = |i: usize, name: &str| -> Result<i64, String> {
        match col(i)? {
            Value::Integer(n) => Ok(n),
            other => Err(format!("{name} is {other:?}, not an integer")),
        }
    };
    let blob = |i: usize| -> Result<Option<Vec<u8>>, String> {
        match col(i)? {
            Value::Null => Ok(None),
            Value::Blob(b) => Ok(Some(b)),
            other => Err(format!("column {} is {other:?}, not a blob", offset + i)),
        }
    };
    let text = |i: usize| -> Result<Option<String>, String> {
        match col(i)? {
            Value::Null => Ok(None),
            Value::Text(t) => Ok(Some(t)),
            other => Err(format!("column {} is {other:?}, not text", offset + i)),
        }
    };
    let failure = || -> Result<Option<Failure>, String> {
        match (text(4)?, text(5)?) {
            (None, None) => Ok(None),
            (Some(class), Some(message)) => {
                let class = FailureClass::parse(&class)
                    .ok_or_else(|| format!("unknown failure class {class:?}"))?;
                Ok(Some(Failure::new(class, message)))
            }
            _ => Err("failure class and message must be set together".to_owned()),
        }
    };
    let state = match int(0, "state")? {
        IN_PROGRESS => {
            let token: [u8; 16] = blob(1)?
                .ok_or("in-progress record without a token")?
                .try_into()
                .map_err(|_| "token is not 16 bytes")?;
            State::InProgress {
                token: LeaseToken::from_u128(u128::from_be_bytes(token)),
                lease_until: timestamp(int(2, "lease_until")?)?,
            }
        }
        COMPLETED => State::Completed {
            response: Bytes::from(blob(3)?.ok_or("completed record without a response")?),
        },
        FAILED => State::Failed {
            failure: failure()?.ok_or("failed record without a failure")?,
        },
        RELEASED => State::Released {
            last_failure: failure()?,
        },
        other => return Err(format!("unknown state {other}")),
    };
    let fingerprint = match blob(6)? {
        None => None,
        Some(b) => Some(Fingerprint::from_digest(
            b.try_into().map_err(|_| "fingerprint is not 32 bytes")?,
        )),
    };
    Ok(Record {
        state,
        fingerprint,
        attempt: u32::try_from(int(7, "attempt")?).map_err(|_| "attempt out of range")?,
        fence: u64::try_from(int(8, "fence")?).map_err(|_| "fence out of range")?,
        created_at: timestamp(int(9, "created_at")?)?,
        updated_at: timestamp(int(10, "updated_at")?)?,
        expires_at: timestamp(int(11, "expires_at")?)?,
    })
}

/// A record as read, with the row's rowid for a cheap update.
pub(crate) type Loaded = (i64, Result<Record, String>);

/// Reads the record for `id`, expired or not. `Err(reason)` in the second
/// half means the row exists but is corrupt.
pub(crate) fn load(conn: &Connection, id: &RecordId) -> rusqlite::Result<Option<Loaded>> {
    const SQL: &str = concat!(
        "SELECT rowid, ",
        columns!(),
        " FROM idem_records WHERE scope = ?1 AND key = ?2"
    );
    conn.prepare_cached(SQL)?
        .query_row(params![id.scope().as_str(), id.key().as_str()], |row| {
            Ok((row.get(0)?, decode(row, 1)))
        })
        .optional()
}

/// How [`store`] writes a record.
pub(crate) enum Place {
    /// Update the row with this rowid in place (the key columns never
    /// change, so the key index is left alone).
    Row(i64),
    /// A lease holder's write ([`idem::machine::decide_write`]) to the row
    /// with this rowid: it changes only the state with its lease or
    /// outcome, and the update and expiry times, so only those are written.
    Held(i64),
    /// Insert a new row; if the key already has one, write nothing and
    /// return `false`.
    NewIfAbsent,
}

/// The statements that write records, each taken from the connection's
/// statement cache once for a batch of jobs rather than once a write
/// (looking one up and handing it back cost about as much as binding its
/// values).
pub(crate) struct Writes<'c> {
    conn: &'c Connection,
    /// By [`Place`] and claim, in the order of the `match` in [`Self::store`].
    prepared: [Option<CachedStatement<'c>>; 4],
}

impl<'c> Writes<'c> {
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Self {
            conn,
            prepared: [None, None, None, None],
        }
    }

    /// The connection the statements run on.
    pub(crate) fn conn(&self) -> &'c Connection {
        self.conn
    }

    /// Writes `r` for `id`; `false` only when [`Place::NewIfAbsent`]
    /// found the key taken.
    pub(crate) fn store(
        &mut self,
        id: &RecordId,
        place: Place,
        r: &Record,
    ) -> rusqlite::Result<bool> {
        let (token, lease_until, response, failure) = match &r.state {
            State::InProgress { token, lease_until } => (
                Some(token.as_u128().to_be_bytes()),
                Some(millis(*lease_until)),
                None,
                None,
            ),
            State::Completed { response } => (None, None, Some(&response[..]), None),
            State::Failed { failure } => (None, None, None, Some(failure)),
            State::Released { last_failure } => (None, None, None, last_failure.as_ref()),
        };
        let token = token.as_ref().map(|t| &t[..]);
        // In the order the statements below bind them: what a holder's write
        // changes first, then what only a claim sets, then the key.
        let values: [&dyn ToSql; 14] = [
            &state_code(r.state.kind()),
            &token,
            &lease_until,
            &response,
            &failure.map(|f| f.class.as_str()),
            &failure.map(|f| f.message.as_str()),
            &millis(r.updated_at),
            &millis(r.expires_at),
            &r.fingerprint.as_ref().map(|f| &f.as_bytes()[..]),
            &i64::from(r.attempt),
            &i64::try_from(r.fence).unwrap_or(i64::MAX),
            &millis(r.created_at),
            &id.scope().as_str(),
            &id.key().as_str(),
        ];
        let (slot, sql, bound): (usize, &str, &[&[&dyn ToSql]]) = match &place {
            Place::Held(rowid) => (
                0,
                "UPDATE idem_records SET state = ?1, token = ?2, lease_until = ?3, response = ?4, \
                 failure_class = ?5, failure_msg = ?6, updated_at = ?7, expires_at = ?8 \
                 WHERE rowid = ?9",
                &[&values[..8], &[rowid]],
            ),
            Place::Row(rowid) => (
                1,
                "UPDATE idem_records SET state = ?1, token = ?2, lease_until = ?3, response = ?4, \
                 failure_class = ?5, failure_msg = ?6, updated_at = ?7, expires_at = ?8, \
                 fingerprint = ?9, attempt = ?10, fence = ?11, created_at = ?12 WHERE rowid = ?13",
                &[&values[..12], &[rowid]],
            ),
            // A claim: no outcome to write.
            Place::NewIfAbsent if response.is_none() && failure.is_none() => (
                2,
                "INSERT INTO idem_records (state, token, lease_until, updated_at, expires_at, \
                 fingerprint, attempt, fence, created_at, scope, key) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
                 ON CONFLICT (scope, key) DO NOTHING",
                &[&values[..3], &values[6..]],
            ),
            Place::NewIfAbsent => (
                3,
                "INSERT INTO idem_records (state, token, lease_until, response, failure_class, \
                 failure_msg, updated_at, expires_at, fingerprint, attempt, fence, created_at, \
                 scope, key) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
                 ON CONFLICT (scope, key) DO NOTHING",
                &[&values[..]],
            ),
        };
        let statement = match &mut self.prepared[slot] {
            Some(statement) => statement,
            empty => empty.insert(self.conn.prepare_cached(sql)?),
        };
        let changed = statement.execute(rusqlite::params_from_iter(
            bound.iter().flat_map(|part| part.iter().copied()),
        ))?;
        Ok(changed == 1)
    }
}

/// The journaled state of step `step` of `id`, if any.
pub(crate) fn load_step(
    conn: &Connection,
    id: &RecordId,
    step: &str,
) -> rusqlite::Result<Option<StepState>> {
    conn.prepare_cached(
        "SELECT attempt, result FROM idem_steps WHERE scope = ?1 AND key = ?2 AND name = ?3",
    )?
    .query_row(params![id.scope().as_str(), id.key().as_str(), step], |r| {
        step_state(r.get(0)?, r.get(1)?)
    })
    .optional()
}

fn step_state(attempt: i64, result: Option<Vec<u8>>) -> rusqlite::Result<StepState> {
    Ok(match result {
        Some(result) => StepState::Done {
            result: Bytes::from(result),
        },
        None => StepState::Started {
            attempt: u32::try_from(attempt)
                .map_err(|_| rusqlite::Error::IntegralValueOutOfRange(0, attempt))?,
        },
    })
}

/// Writes step `step` of `id` as `state`.
pub(crate) fn store_step(
    conn: &Connection,
    id: &RecordId,
    step: &str,
    state: &StepState,
) -> rusqlite::Result<()> {
    let (attempt, result) = match state {
        StepState::Started { attempt } => (i64::from(*attempt), None),
        StepState::Done { result } => (0, Some(&result[..])),
    };
    conn.prepare_cached(
        "INSERT INTO idem_steps (scope, key, name, attempt, result) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (scope, key, name) DO UPDATE SET attempt = excluded.attempt, result = excluded.result",
    )?
    .execute(params![id.scope().as_str(), id.key().as_str(), step, attempt, result])?;
    Ok(())
}

/// Removes the journal of `id`.
pub(crate) fn delete_steps(conn: &Connection, id: &RecordId) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM idem_steps WHERE scope = ?1 AND key = ?2")?
        .execute(params![id.scope().as_str(), id.key().as_str()])?;
    Ok(())
}

/// The journal of `id`, in step-name order.
pub(crate) fn load_steps(conn: &Connection, id: &RecordId) -> rusqlite::Result<Vec<StepEntry>> {
    conn.prepare_cached(
        "SELECT name, attempt, result FROM idem_steps WHERE scope = ?1 AND key = ?2 ORDER BY name",
    )?
    .query_map(params![id.scope().as_str(), id.key().as_str()], |r| {
        Ok(StepEntry {
            name: r.get(0)?,
            state: step_state(r.get(1)?, r.get(2)?)?,
        })
    })?
    .collect()
}

/// Keys read back from the file were validated when written, under
/// whatever length limit the writer configured: only the character rule is
/// checked again.
pub(crate) fn stored_key_rules() -> KeyRules {
    KeyRules::default().max_len(std::num::NonZeroUsize::MAX)
}
