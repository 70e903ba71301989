//! Rows back into idem's types. A row that does not decode is
//! [`StoreError::Corrupt`], naming the record and what was wrong.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idem::store::{ClaimOutcome, Lease, LeaseToken, StepBegin};
use idem::{
    Failure, FailureClass, Fingerprint, Record, RecordId, Resolved, State, StepEntry, StepState,
    StoreError, Timestamp,
};
use tokio_postgres::Row;

/// Milliseconds since the epoch, as idem keeps time.
pub(crate) fn timestamp(t: SystemTime) -> Timestamp {
    let ms = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    Timestamp::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// A duration as the `float8` milliseconds the statements take, at most
/// [`idem::store::LONGEST_HELD`] (`Duration::MAX` overflows an interval).
pub(crate) fn ms(d: Duration) -> f64 {
    idem::store::held(d).as_secs_f64() * 1000.0
}

pub(crate) fn token_bytes(token: LeaseToken) -> [u8; 16] {
    token.as_u128().to_be_bytes()
}

fn corrupt(id: &RecordId, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        reason: reason.into(),
    }
}

fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    id: &RecordId,
    name: &str,
) -> Result<T, StoreError> {
    row.try_get(name)
        .map_err(|e| corrupt(id, format!("column {name}: {e}")))
}

fn fingerprint(row: &Row, id: &RecordId) -> Result<Option<Fingerprint>, StoreError> {
    let raw: Option<Vec<u8>> = column(row, id, "fingerprint")?;
    raw.map(|b| {
        <[u8; 32]>::try_from(b.as_slice())
            .map(Fingerprint::from_digest)
            .map_err(|_| corrupt(id, format!("fingerprint of {} bytes", b.len())))
    })
    .transpose()
}

fn failure(row: &Row, id: &RecordId) -> Result<Option<Failure>, StoreError> {
    let class: Option<String> = column(row, id, "failure_class")?;
    let Some(class) = class else {
        return Ok(None);
    };
    let class = FailureClass::parse(&class)
        .ok_or_else(|| corrupt(id, format!("failure class {class:?}")))?;
    let message: Option<Vec<u8>> = column(row, id, "failure_message")?;
    let message = String::from_utf8(message.unwrap_or_default())
        .map_err(|_| corrupt(id, "failure message is not UTF-8"))?;
    Ok(Some(Failure::new(class, message)))
}

fn attempt(row: &Row, id: &RecordId) -> Result<u32, StoreError> {
    let n: i32 = column(row, id, "attempt")?;
    u32::try_from(n).map_err(|_| corrupt(id, format!("attempt {n}")))
}

fn fence(row: &Row, id: &RecordId) -> Result<u64, StoreError> {
    let n: i64 = column(row, id, "fence")?;
    u64::try_from(n).map_err(|_| corrupt(id, format!("fence {n}")))
}

/// The answer of `sql/claim_remembering.sql` (see there), or `None` when
/// the client must run it again.
pub(crate) fn remembered_claim_outcome(
    rows: &[Row],
    id: &RecordId,
    token: LeaseToken,
    wanted: Option<Fingerprint>,
    first_day: u32,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let expired_at = |row: &Row| column::<SystemTime>(row, id, "expires_at").map(timestamp);
    let forgotten = |row: &Row| -> Result<ClaimOutcome, StoreError> {
        Ok(ClaimOutcome::Forgotten {
            expired_at: expired_at(row)?,
        })
    };
    let state = |row: &Row| column::<String>(row, id, "state");
    let mut remembered = None;
    let mut held = None;
    for row in rows {
        if state(row)? == "forgotten" {
            remembered = Some(row);
        } else {
            held = Some(row);
        }
    }
    if let Some(outcome) = claim_outcome(held, id, token, wanted)? {
        return Ok(Some(outcome));
    }
    if let Some(row) = held {
        // Not acquired and not live: an expired row that ended with this
        // fingerprint, kept from the claim by the memory.
        let ended = matches!(state(row)?.as_str(), "completed" | "failed");
        let live: bool = column(row, id, "live")?;
        let kept = idem::horizon::day_of(expired_at(row)?) >= first_day;
        if ended && !live && kept && fingerprint(row, id)? == wanted {
            return forgotten(row).map(Some);
        }
    }
    remembered.map(forgotten).transpose()
}

/// The answer of the claim statement, or `None` when the client must run
/// it again (the statement's snapshot did not show the row that stopped
/// the claim, or showed it in a state that should have been claimable).
pub(crate) fn claim_outcome(
    row: Option<&Row>,
    id: &RecordId,
    token: LeaseToken,
    wanted: Option<Fingerprint>,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let Some(row) = row else {
        return Ok(None);
    };
    let lease_until = |row: &Row| -> Result<Timestamp, StoreError> {
        let t: Option<SystemTime> = column(row, id, "lease_until")?;
        t.map(timestamp)
            .ok_or_else(|| corrupt(id, "in progress without lease_until"))
    };
    if column::<bool>(row, id, "acquired")? {
        return Ok(Some(ClaimOutcome::Acquired(Lease {
            id: id.clone(),
            token,
            fence: fence(row, id)?,
            attempt: attempt(row, id)?,
            takeover: column(row, id, "takeover")?,
            lease_until: lease_until(row)?,
        })));
    }
    if !column::<bool>(row, id, "live")? {
        return Ok(None);
    }
    if fingerprint(row, id)? != wanted {
        return Ok(Some(ClaimOutcome::Mismatch));
    }
    let state: String = column(row, id, "state")?;
    Ok(match state.as_str() {
        "completed" => {
            let response: Option<Vec<u8>> = column(row, id, "response")?;
            Some(ClaimOutcome::Completed(Bytes::from(response.ok_or_else(
                || corrupt(id, "completed without a response"),
            )?)))
        }
        "failed" => Some(ClaimOutcome::Failed(
            failure(row, id)?.ok_or_else(|| corrupt(id, "failed without a failure"))?,
        )),
        "in_progress" => {
            let left: Option<i64> = column(row, id, "lease_left_ms")?;
            match left {
                Some(ms) if ms > 0 => Some(ClaimOutcome::InProgress {
                    retry_after: Duration::from_millis(ms.unsigned_abs()),
                }),
                _ => None,
            }
        }
        "released" => None,
        other => return Err(corrupt(id, format!("state {other:?}"))),
    })
}

/// A whole record (the `get`/`list` columns) and its id.
pub(crate) fn record(row: &Row) -> Result<(RecordId, Record), StoreError> {
    let scope: String = row
        .try_get("scope")
        .map_err(|e| StoreError::Backend(Box::new(e)))?;
    let key: String = row
        .try_get("key")
        .map_err(|e| StoreError::Backend(Box::new(e)))?;
    let id = RecordId::parse(&scope, &key).map_err(|e| StoreError::Corrupt {
        id: format!("{scope}/{key}"),
        reason: e.to_string(),
    })?;
    let state: String = column(row, &id, "state")?;
    let state = match state.as_str() {
        "in_progress" => {
            let token: Option<Vec<u8>> = column(row, &id, "token")?;
            let token = token
                .and_then(|t| <[u8; 16]>::try_from(t.as_slice()).ok())
                .map(|t| LeaseToken::from_u128(u128::from_be_bytes(t)))
                .ok_or_else(|| corrupt(&id, "in progress without a 16-byte token"))?;
            let until: Option<SystemTime> = column(row, &id, "lease_until")?;
            State::InProgress {
                token,
                lease_until: until
                    .map(timestamp)
                    .ok_or_else(|| corrupt(&id, "in progress without lease_until"))?,
            }
        }
        "completed" => {
            let response: Option<Vec<u8>> = column(row, &id, "response")?;
            State::Completed {
                response: Bytes::from(
                    response.ok_or_else(|| corrupt(&id, "completed without a response"))?,
                ),
            }
        }
        "failed" => State::Failed {
            failure: failure(row, &id)?.ok_or_else(|| corrupt(&id, "failed without a failure"))?,
        },
        "released" => State::Released {
            last_failure: failure(row, &id)?,
        },
        other => return Err(corrupt(&id, format!("state {other:?}"))),
    };
    let record = Record {
        state,
        fingerprint: fingerprint(row, &id)?,
        attempt: attempt(row, &id)?,
        fence: fence(row, &id)?,
        created_at: timestamp(column(row, &id, "created_at")?),
        updated_at: timestamp(column(row, &id, "updated_at")?),
        expires_at: timestamp(column(row, &id, "expires_at")?),
    };
    Ok((id, record))
}

fn started(id: &RecordId, attempt: i32) -> Result<StepState, StoreError> {
    u32::try_from(attempt)
        .map(|attempt| StepState::Started { attempt })
        .map_err(|_| corrupt(id, format!("step attempt {attempt} out of range")))
}

/// The step_begin statement's row, for the holder of attempt `own`.
pub(crate) fn step_begin(
    id: &RecordId,
    own: u32,
    row: Option<&Row>,
) -> Result<StepBegin, StoreError> {
    let row = row.ok_or_else(|| corrupt(id, "step_begin returned no row"))?;
    let read = |e: tokio_postgres::Error| corrupt(id, format!("step_begin row: {e}"));
    let held: bool = row.try_get(0).map_err(read)?;
    let attempt: Option<i32> = row.try_get(1).map_err(read)?;
    let result: Option<Vec<u8>> = row.try_get(2).map_err(read)?;
    if !held {
        return Err(StoreError::LeaseLost);
    }
    let earlier = attempt
        .map(|attempt| {
            u32::try_from(attempt)
                .map_err(|_| corrupt(id, format!("step attempt {attempt} out of range")))
        })
        .transpose()?;
    Ok(idem::machine::step_found(
        result.map(Bytes::from),
        earlier,
        own,
    ))
}

/// One row of the steps statement.
pub(crate) fn step_entry(id: &RecordId, row: &Row) -> Result<StepEntry, StoreError> {
    let read = |e: tokio_postgres::Error| corrupt(id, format!("steps row: {e}"));
    let name: String = row.try_get(0).map_err(read)?;
    let attempt: i32 = row.try_get(1).map_err(read)?;
    let result: Option<Vec<u8>> = row.try_get(2).map_err(read)?;
    let state = match result {
        Some(result) => StepState::Done {
            result: Bytes::from(result),
        },
        None => started(id, attempt)?,
    };
    Ok(StepEntry { name, state })
}

/// The resolve statement's row.
pub(crate) fn resolved(id: &RecordId, row: Option<&Row>) -> Result<Resolved, StoreError> {
    let row = row.ok_or_else(|| corrupt(id, "resolve returned no row"))?;
    let answer: String = row
        .try_get(0)
        .map_err(|e| corrupt(id, format!("resolve row: {e}")))?;
    match answer.as_str() {
        "R" => Ok(Resolved::Released),
        "P" => Ok(Resolved::NotParked),
        "S" => Ok(Resolved::StepNotInDoubt),
        other => Err(corrupt(id, format!("resolve answered {other:?}"))),
    }
}
