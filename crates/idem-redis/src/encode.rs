//! Replies of the scripts turned into idem's types. A reply that does not
//! have the expected shape is a [`StoreError::Corrupt`] naming the record,
//! never a panic.

use std::collections::HashMap;

use bytes::Bytes;
use idem::store::{ClaimOutcome, Lease, LeaseToken, StepBegin};
use idem::{
    Failure, FailureClass, Fingerprint, Record, RecordId, Resolved, State, StepEntry, StepState,
    StoreError, Timestamp,
};
use redis::Value;

fn corrupt(id: &RecordId, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        id: id.to_string(),
        reason: reason.into(),
    }
}

fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        _ => None,
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn millis(value: &Value) -> Option<Timestamp> {
    int(value)
        .and_then(|n| u64::try_from(n).ok())
        .map(Timestamp::from_millis)
}

/// The claim script's reply.
pub(crate) fn claim_outcome(
    id: &RecordId,
    token: LeaseToken,
    reply: Value,
) -> Result<ClaimOutcome, StoreError> {
    let Value::Array(items) = reply else {
        return Err(corrupt(id, format!("claim replied {reply:?}")));
    };
    let shape = || corrupt(id, format!("claim replied {items:?}"));
    let tag = items.first().cloned().and_then(bytes).ok_or_else(shape)?;
    match (tag.as_slice(), items.len()) {
        (b"A", 5) => {
            let number = |i: usize| int(&items[i]).ok_or_else(shape);
            Ok(ClaimOutcome::Acquired(Lease {
                id: id.clone(),
                token,
                fence: u64::try_from(number(1)?).map_err(|_| shape())?,
                attempt: u32::try_from(number(2)?).map_err(|_| shape())?,
                takeover: number(3)? == 1,
                lease_until: millis(&items[4]).ok_or_else(shape)?,
            }))
        }
        (b"P", 2) => {
            let ms = int(&items[1]).ok_or_else(shape)?;
            Ok(ClaimOutcome::InProgress {
                retry_after: std::time::Duration::from_millis(ms.max(1).unsigned_abs()),
            })
        }
        (b"C", 2) => {
            let response = items.into_iter().nth(1).and_then(bytes);
            Ok(ClaimOutcome::Completed(Bytes::from(response.ok_or_else(
                || corrupt(id, "completed record without a response"),
            )?)))
        }
        (b"F", 3) => {
            let mut it = items.into_iter().skip(1);
            let class = it.next().and_then(bytes);
            let message = it.next().and_then(bytes);
            Ok(ClaimOutcome::Failed(failure(id, class, message)?))
        }
        (b"M", 1) => Ok(ClaimOutcome::Mismatch),
        (b"G", 2) => Ok(ClaimOutcome::Forgotten {
            expired_at: millis(&items[1]).ok_or_else(shape)?,
        }),
        _ => Err(shape()),
    }
}

fn failure(
    id: &RecordId,
    class: Option<Vec<u8>>,
    message: Option<Vec<u8>>,
) -> Result<Failure, StoreError> {
    let class = class
        .as_deref()
        .and_then(|c| std::str::from_utf8(c).ok())
        .and_then(FailureClass::parse)
        .ok_or_else(|| corrupt(id, "failure without a known class"))?;
    let message = message.ok_or_else(|| corrupt(id, "failure without a message"))?;
    let message =
        String::from_utf8(message).map_err(|_| corrupt(id, "failure message is not UTF-8"))?;
    Ok(Failure::new(class, message))
}

/// The get script's reply: a flat field/value list, empty when absent.
/// Returns the id stored in the record (for listing) and the record.
pub(crate) fn record(
    expected: Option<&RecordId>,
    reply: Value,
) -> Result<Option<(RecordId, Record)>, StoreError> {
    let items = match reply {
        Value::Array(items) => items,
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        Value::Nil => return Ok(None),
        other => {
            let who = expected.map_or_else(|| "a listed record".to_owned(), |id| id.to_string());
            return Err(StoreError::Corrupt {
                id: who,
                reason: format!("get replied {other:?}"),
            });
        }
    };
    if items.is_empty() {
        return Ok(None);
    }
    let mut fields: HashMap<String, Value> = HashMap::new();
    let mut it = items.into_iter();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        if let Some(name) = bytes(name).and_then(|n| String::from_utf8(n).ok()) {
            fields.insert(name, value);
        }
    }
    let text = |fields: &mut HashMap<String, Value>, name: &str| {
        fields
            .remove(name)
            .and_then(bytes)
            .and_then(|b| String::from_utf8(b).ok())
    };
    let scope = text(&mut fields, "s");
    let key = text(&mut fields, "k");
    let id = match (scope, key) {
        (Some(scope), Some(key)) => {
            RecordId::parse(&scope, &key).map_err(|e| StoreError::Corrupt {
                id: format!("{scope}/{key}"),
                reason: format!("stored id is invalid: {e}"),
            })?
        }
        _ => {
            return Err(StoreError::Corrupt {
                id: expected.map_or_else(|| "a listed record".to_owned(), |id| id.to_string()),
                reason: "record without its scope and key".into(),
            })
        }
    };
    if expected.is_some_and(|e| *e != id) {
        return Err(corrupt(&id, "the record holds another id"));
    }
    let number = |fields: &HashMap<String, Value>, name: &str| {
        fields
            .get(name)
            .and_then(int)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| corrupt(&id, format!("field {name} missing or not a number")))
    };
    let state = match text(&mut fields, "st").as_deref() {
        Some("p") => State::InProgress {
            token: text(&mut fields, "tk")
                .as_deref()
                .and_then(LeaseToken::from_hex)
                .ok_or_else(|| corrupt(&id, "in progress without a token"))?,
            lease_until: Timestamp::from_millis(number(&fields, "lu")?),
        },
        Some("c") => State::Completed {
            response: Bytes::from(
                fields
                    .remove("rs")
                    .and_then(bytes)
                    .ok_or_else(|| corrupt(&id, "completed without a response"))?,
            ),
        },
        Some("f") => State::Failed {
            failure: failure(
                &id,
                fields.remove("fc").and_then(bytes),
                fields.remove("fm").and_then(bytes),
            )?,
        },
        Some("r") => State::Released {
            last_failure: match fields.remove("fc").and_then(bytes) {
                Some(class) => Some(failure(
                    &id,
                    Some(class),
                    fields.remove("fm").and_then(bytes),
                )?),
                None => None,
            },
        },
        other => return Err(corrupt(&id, format!("unknown state {other:?}"))),
    };
    let fingerprint = match text(&mut fields, "fp").as_deref() {
        None | Some("") => None,
        Some(hex) => {
            Some(Fingerprint::from_hex(hex).ok_or_else(|| corrupt(&id, "fingerprint is not hex"))?)
        }
    };
    let record = Record {
        state,
        fingerprint,
        attempt: u32::try_from(number(&fields, "at")?)
            .map_err(|_| corrupt(&id, "attempt out of range"))?,
        fence: number(&fields, "fe")?,
        created_at: Timestamp::from_millis(number(&fields, "ca")?),
        updated_at: Timestamp::from_millis(number(&fields, "ua")?),
        expires_at: Timestamp::from_millis(number(&fields, "ex")?),
    };
    Ok(Some((id, record)))
}

/// The begin_step script's reply, for the holder of attempt `own`.
pub(crate) fn step_begin(id: &RecordId, own: u32, reply: Value) -> Result<StepBegin, StoreError> {
    let Value::Array(items) = reply else {
        return Err(corrupt(id, format!("begin_step replied {reply:?}")));
    };
    let shape = || corrupt(id, format!("begin_step replied {items:?}"));
    let tag = items.first().cloned().and_then(bytes).ok_or_else(shape)?;
    match (tag.as_slice(), items.len()) {
        (b"L", 1) => Err(StoreError::LeaseLost),
        (b"N", 1) => Ok(StepBegin::Fresh),
        (b"I", 2) => Ok(idem::machine::step_begun(
            int(&items[1])
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(shape)?,
            own,
        )),
        (b"D", 2) => Ok(StepBegin::Done(Bytes::from(
            items.into_iter().nth(1).and_then(bytes).unwrap_or_default(),
        ))),
        _ => Err(shape()),
    }
}

/// One journal value: `s<attempt>` or `d<result>`.
fn step_state(id: &RecordId, value: &[u8]) -> Result<StepState, StoreError> {
    match value.split_first() {
        Some((b'd', result)) => Ok(StepState::Done {
            result: Bytes::copy_from_slice(result),
        }),
        Some((b's', attempt)) => std::str::from_utf8(attempt)
            .ok()
            .and_then(|a| a.parse().ok())
            .map(|attempt| StepState::Started { attempt })
            .ok_or_else(|| corrupt(id, "a started step without its attempt")),
        _ => Err(corrupt(id, "a step journal value of unknown form")),
    }
}

/// The steps script's reply, in step-name order.
pub(crate) fn steps(id: &RecordId, reply: Value) -> Result<Vec<StepEntry>, StoreError> {
    let Value::Array(items) = reply else {
        return Err(corrupt(id, format!("steps replied {reply:?}")));
    };
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(name), Some(value)) = (it.next(), it.next()) {
        let name = bytes(name)
            .and_then(|n| String::from_utf8(n).ok())
            .ok_or_else(|| corrupt(id, "a step name that is not UTF-8"))?;
        let value = bytes(value).ok_or_else(|| corrupt(id, "a step without a value"))?;
        out.push(StepEntry {
            state: step_state(id, &value)?,
            name,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The resolve script's reply.
pub(crate) fn resolved(id: &RecordId, reply: Value) -> Result<Resolved, StoreError> {
    match bytes(reply.clone()).as_deref() {
        Some(b"R") => Ok(Resolved::Released),
        Some(b"P") => Ok(Resolved::NotParked),
        Some(b"S") => Ok(Resolved::StepNotInDoubt),
        _ => Err(corrupt(id, format!("resolve replied {reply:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> RecordId {
        RecordId::parse("s", "k").expect("valid")
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn malformed_claim_replies_are_corrupt_not_panics() {
        let token = LeaseToken::from_parts(1, 2);
        for reply in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![bulk("A"), Value::Int(1)]),
            Value::Array(vec![
                bulk("A"),
                Value::Int(-1),
                Value::Int(1),
                Value::Int(0),
                Value::Int(5),
            ]),
            Value::Array(vec![bulk("F"), bulk("sideways"), bulk("x")]),
            Value::Array(vec![bulk("Z")]),
        ] {
            let got = claim_outcome(&id(), token, reply.clone());
            assert!(
                matches!(got, Err(StoreError::Corrupt { .. })),
                "{reply:?} gave {got:?}"
            );
        }
    }

    #[test]
    fn records_decode_every_state() {
        let base = |st: &str| {
            vec![
                bulk("s"),
                bulk("s"),
                bulk("k"),
                bulk("k"),
                bulk("st"),
                bulk(st),
                bulk("fp"),
                bulk(""),
                bulk("at"),
                bulk("2"),
                bulk("fe"),
                bulk("1763712345678901"),
                bulk("ca"),
                bulk("10"),
                bulk("ua"),
                bulk("11"),
                bulk("ex"),
                bulk("99"),
            ]
        };
        let mut released = base("r");
        released.extend([bulk("fc"), bulk("retryable"), bulk("fm"), bulk("busy")]);
        let (_, r) = record(Some(&id()), Value::Array(released))
            .expect("decodes")
            .expect("present");
        assert_eq!(
            r.state,
            State::Released {
                last_failure: Some(Failure::new(FailureClass::Retryable, "busy"))
            }
        );
        assert_eq!((r.attempt, r.fence), (2, 1_763_712_345_678_901));
        let got = record(Some(&id()), Value::Array(base("p")));
        assert!(matches!(got, Err(StoreError::Corrupt { .. })), "{got:?}");
        let other = RecordId::parse("s", "other").expect("valid");
        let got = record(Some(&other), Value::Array(base("c")));
        assert!(matches!(got, Err(StoreError::Corrupt { .. })), "{got:?}");
        assert_eq!(record(Some(&id()), Value::Array(vec![])).expect("ok"), None);
    }
}
