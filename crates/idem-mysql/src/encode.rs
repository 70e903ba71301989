//! Rows back into idem's types. A row that does not decode is
//! [`StoreError::Corrupt`], naming the record and what was wrong. Times
//! arrive as milliseconds since the epoch (the statements convert them).

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, Lease, LeaseToken, StepBegin};
use idem::{
    Failure, FailureClass, Fingerprint, Record, RecordId, Resolved, State, StepEntry, StepState,
    StoreError, Timestamp,
};
use mysql_async::{Row, Value};

/// A duration as the whole milliseconds the statements take, at most
/// [`idem::store::LONGEST_HELD`] (rounded up, so a lease is never shorter than
/// asked).
pub(crate) fn ms(d: Duration) -> i64 {
    let held = idem::store::held(d);
    let ms = held.as_millis() + u128::from(!held.subsec_nanos().is_multiple_of(1_000_000));
    i64::try_from(ms).unwrap_or(i64::MAX)
}

pub(crate) fn token_bytes(token: LeaseToken) -> Vec<u8> {
    token.as_u128().to_be_bytes().to_vec()
}

fn corrupt(id: &RecordId, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        reason: reason.into(),
    }
}

/// The value of column `name`, `NULL` if the row has no such column.
pub(crate) fn value<'a>(row: &'a Row, name: &str) -> &'a Value {
    row.columns_ref()
        .iter()
        .position(|c| c.name_str() == name)
        .and_then(|i| row.as_ref(i))
        .unwrap_or(&Value::NULL)
}

/// An integer, as the binary protocol sends integers, and as it sends
/// decimals (text).
fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::UInt(n) => i64::try_from(*n).ok(),
        Value::Bytes(text) => std::str::from_utf8(text).ok()?.trim().parse().ok(),
        _ => None,
    }
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::Bytes(b) => Some(b),
        _ => None,
    }
}

fn opt_int(row: &Row, id: &RecordId, name: &str) -> Result<Option<i64>, StoreError> {
    match value(row, name) {
        Value::NULL => Ok(None),
        v => int(v)
            .map(Some)
            .ok_or_else(|| corrupt(id, format!("column {name}: {v:?} is not an integer"))),
    }
}

fn req_int(row: &Row, id: &RecordId, name: &str) -> Result<i64, StoreError> {
    opt_int(row, id, name)?.ok_or_else(|| corrupt(id, format!("column {name} is NULL")))
}

fn opt_bytes(row: &Row, id: &RecordId, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
    match value(row, name) {
        Value::NULL => Ok(None),
        v => bytes(v)
            .map(|b| Some(b.to_vec()))
            .ok_or_else(|| corrupt(id, format!("column {name}: {v:?} is not bytes"))),
    }
}

fn text(row: &Row, id: &RecordId, name: &str) -> Result<String, StoreError> {
    let raw = opt_bytes(row, id, name)?.ok_or_else(|| corrupt(id, format!("{name} is NULL")))?;
    String::from_utf8(raw).map_err(|_| corrupt(id, format!("{name} is not UTF-8")))
}

fn flag(row: &Row, id: &RecordId, name: &str) -> Result<bool, StoreError> {
    Ok(req_int(row, id, name)? != 0)
}

fn time(row: &Row, id: &RecordId, name: &str) -> Result<Option<Timestamp>, StoreError> {
    opt_int(row, id, name)?
        .map(|ms| {
            u64::try_from(ms)
                .map(Timestamp::from_millis)
                .map_err(|_| corrupt(id, format!("{name} {ms} before the epoch")))
        })
        .transpose()
}

fn req_time(row: &Row, id: &RecordId, name: &str) -> Result<Timestamp, StoreError> {
    time(row, id, name)?.ok_or_else(|| corrupt(id, format!("{name} is NULL")))
}

fn fingerprint(row: &Row, id: &RecordId) -> Result<Option<Fingerprint>, StoreError> {
    opt_bytes(row, id, "fingerprint")?
        .map(|b| {
            <[u8; 32]>::try_from(b.as_slice())
                .map(Fingerprint::from_digest)
                .map_err(|_| corrupt(id, format!("fingerprint of {} bytes", b.len())))
        })
        .transpose()
}

fn failure(row: &Row, id: &RecordId) -> Result<Option<Failure>, StoreError> {
    if matches!(value(row, "failure_class"), Value::NULL) {
        return Ok(None);
    }
    let class = text(row, id, "failure_class")?;
    let class = FailureClass::parse(&class)
        .ok_or_else(|| corrupt(id, format!("failure class {class:?}")))?;
    let message = opt_bytes(row, id, "failure_message")?.unwrap_or_default();
    let message =
        String::from_utf8(message).map_err(|_| corrupt(id, "failure message is not UTF-8"))?;
    Ok(Some(Failure::new(class, message)))
}

fn attempt(row: &Row, id: &RecordId) -> Result<u32, StoreError> {
    let n = req_int(row, id, "attempt")?;
    u32::try_from(n).map_err(|_| corrupt(id, format!("attempt {n}")))
}

fn fence(row: &Row, id: &RecordId) -> Result<u64, StoreError> {
    match value(row, "fence") {
        Value::UInt(n) => Ok(*n),
        v => int(v)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| corrupt(id, format!("fence {v:?}"))),
    }
}

fn response(row: &Row, id: &RecordId) -> Result<Bytes, StoreError> {
    opt_bytes(row, id, "response")?
        .map(Bytes::from)
        .ok_or_else(|| corrupt(id, "completed without a response"))
}

/// The position `n` a batch answer names (1-based), as an index.
pub(crate) fn slot(row: &Row) -> Option<usize> {
    int(value(row, "n"))
        .and_then(|n| usize::try_from(n).ok())
        .and_then(|n| n.checked_sub(1))
}

/// The answer of `idem_complete_many`: whether each of its `items` was
/// written.
pub(crate) fn written(row: Option<&Row>, items: usize) -> Result<Vec<bool>, StoreError> {
    let answer = row
        .and_then(|r| r.as_ref(0))
        .and_then(bytes)
        .unwrap_or_default();
    if answer.len() != items || answer.iter().any(|b| !matches!(b, b'0' | b'1')) {
        return Err(StoreError::Backend(
            format!(
                "complete_many answered {:?} for {items} items",
                String::from_utf8_lossy(answer)
            )
            .into(),
        ));
    }
    Ok(answer.iter().map(|&b| b == b'1').collect())
}

/// The answer of a claim (`idem_claim_row`), or `None` when the client
/// must claim again (a state that should have been claimable).
pub(crate) fn claim_outcome(
    row: Option<&Row>,
    id: &RecordId,
    token: LeaseToken,
    wanted: Option<Fingerprint>,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let Some(row) = row else {
        return Err(corrupt(id, "the claim answered no row"));
    };
    if flag(row, id, "acquired")? {
        return Ok(Some(ClaimOutcome::Acquired(Lease {
            id: id.clone(),
            token,
            fence: fence(row, id)?,
            attempt: attempt(row, id)?,
            takeover: flag(row, id, "takeover")?,
            lease_until: req_time(row, id, "lease_until")?,
        })));
    }
    if !flag(row, id, "live")? {
        return Ok(None);
    }
    if fingerprint(row, id)? != wanted {
        return Ok(Some(ClaimOutcome::Mismatch));
    }
    Ok(match text(row, id, "state")?.as_str() {
        "completed" => Some(ClaimOutcome::Completed(response(row, id)?)),
        "failed" => Some(ClaimOutcome::Failed(
            failure(row, id)?.ok_or_else(|| corrupt(id, "failed without a failure"))?,
        )),
        "in_progress" => match opt_int(row, id, "lease_left_ms")? {
            Some(ms) if ms > 0 => Some(ClaimOutcome::InProgress {
                retry_after: Duration::from_millis(ms.unsigned_abs()),
            }),
            _ => None,
        },
        "released" => None,
        other => return Err(corrupt(id, format!("state {other:?}"))),
    })
}

/// A whole record (the `{record}` columns) and its id.
pub(crate) fn record(row: &Row) -> Result<(RecordId, Record), StoreError> {
    let name = |column: &str| {
        bytes(value(row, column))
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    let (scope, key) = (name("scope"), name("key"));
    let id = RecordId::parse(&scope, &key).map_err(|e| StoreError::Corrupt {
        id: format!("{scope}/{key}"),
        reason: e.to_string(),
    })?;
    let state = match text(row, &id, "state")?.as_str() {
        "in_progress" => {
            let token = opt_bytes(row, &id, "token")?
                .and_then(|t| <[u8; 16]>::try_from(t.as_slice()).ok())
                .map(|t| LeaseToken::from_u128(u128::from_be_bytes(t)))
                .ok_or_else(|| corrupt(&id, "in progress without a 16-byte token"))?;
            State::InProgress {
                token,
                lease_until: req_time(row, &id, "lease_until")?,
            }
        }
        "completed" => State::Completed {
            response: response(row, &id)?,
        },
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
        created_at: req_time(row, &id, "created_at")?,
        updated_at: req_time(row, &id, "updated_at")?,
        expires_at: req_time(row, &id, "expires_at")?,
    };
    Ok((id, record))
}

/// The `idem_step_begin` answer, for the holder of attempt `own`.
pub(crate) fn step_begin(
    id: &RecordId,
    own: u32,
    row: Option<&Row>,
) -> Result<StepBegin, StoreError> {
    let row = row.ok_or_else(|| corrupt(id, "step_begin answered no row"))?;
    if !flag(row, id, "held")? {
        return Err(StoreError::LeaseLost);
    }
    let earlier = opt_int(row, id, "prev_attempt")?
        .map(|attempt| {
            u32::try_from(attempt)
                .map_err(|_| corrupt(id, format!("step attempt {attempt} out of range")))
        })
        .transpose()?;
    let result = opt_bytes(row, id, "prev_result")?.map(Bytes::from);
    Ok(idem::machine::step_found(result, earlier, own))
}

/// One row of the steps statement.
pub(crate) fn step_entry(id: &RecordId, row: &Row) -> Result<StepEntry, StoreError> {
    let name = text(row, id, "name")?;
    let state = match opt_bytes(row, id, "result")? {
        Some(result) => StepState::Done {
            result: Bytes::from(result),
        },
        None => {
            let attempt = req_int(row, id, "attempt")?;
            StepState::Started {
                attempt: u32::try_from(attempt)
                    .map_err(|_| corrupt(id, format!("step attempt {attempt} out of range")))?,
            }
        }
    };
    Ok(StepEntry { name, state })
}

/// The `idem_resolve` answer.
pub(crate) fn resolved(id: &RecordId, row: Option<&Row>) -> Result<Resolved, StoreError> {
    let answer = row
        .and_then(|r| r.as_ref(0))
        .and_then(bytes)
        .ok_or_else(|| corrupt(id, "resolve answered no row"))?;
    match answer {
        b"R" => Ok(Resolved::Released),
        b"P" => Ok(Resolved::NotParked),
        b"S" => Ok(Resolved::StepNotInDoubt),
        other => Err(corrupt(
            id,
            format!("resolve answered {:?}", String::from_utf8_lossy(other)),
        )),
    }
}

/// Column `i` of `row` as an integer (a `ttl`, a lease's end, a flag).
pub(crate) fn int_at(row: &Row, i: usize) -> Option<i64> {
    row.as_ref(i).and_then(int)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_milliseconds_and_stop_at_the_longest_held() {
        assert_eq!(ms(Duration::from_micros(1500)), 2);
        assert_eq!(ms(Duration::from_millis(7)), 7);
        assert_eq!(ms(Duration::ZERO), 0);
        assert_eq!(
            ms(Duration::MAX),
            i64::try_from(idem::store::LONGEST_HELD.as_millis()).expect("fits")
        );
    }

    #[test]
    fn integers_arrive_as_ints_or_as_decimal_text() {
        assert_eq!(int(&Value::Int(-3)), Some(-3));
        assert_eq!(int(&Value::UInt(4)), Some(4));
        assert_eq!(int(&Value::Bytes(b"999".to_vec())), Some(999));
        assert_eq!(int(&Value::Bytes(b"x".to_vec())), None);
        assert_eq!(int(&Value::NULL), None);
    }
}
