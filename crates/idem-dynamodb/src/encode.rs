//! A record as a DynamoDB item (the layout is in the crate docs), and
//! back.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;
use idem::store::LeaseToken;
use idem::{
    Failure, FailureClass, Fingerprint, Record, RecordId, State, StepEntry, StepState, StoreError,
    Timestamp,
};

use crate::horizon::Memory;

/// An item as the SDK holds it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// DynamoDB's limit on one item, attribute names included.
pub(crate) const ITEM_LIMIT: usize = 400 * 1024;

/// The partition key of `id`. Scopes and keys are printable ASCII, so a
/// newline never occurs in either.
pub(crate) fn pk(id: &RecordId) -> String {
    format!("{}\n{}", id.scope().as_str(), id.key().as_str())
}

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(crate) fn b(v: impl Into<Vec<u8>>) -> AttributeValue {
    AttributeValue::B(Blob::new(v))
}

/// A step marked started by `attempt`, in the write carrying `nonce`.
pub(crate) fn started(attempt: u32, nonce: LeaseToken) -> AttributeValue {
    AttributeValue::M(HashMap::from([
        ("a".to_owned(), n(attempt)),
        ("n".to_owned(), s(nonce.to_hex())),
    ]))
}

/// A finished step with its result.
pub(crate) fn done(result: &[u8]) -> AttributeValue {
    AttributeValue::M(HashMap::from([("d".to_owned(), b(result.to_vec()))]))
}

/// A stored item, decoded.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) id: RecordId,
    pub(crate) record: Record,
    pub(crate) version: u64,
    /// The nonce of the holder's write that made the current state: a
    /// write refused by its condition whose nonce is on the item had
    /// landed (the SDK retried it after its answer was lost).
    pub(crate) nonce: Option<LeaseToken>,
    /// The raw journal, copied as is when a claim keeps it.
    pub(crate) journal: HashMap<String, AttributeValue>,
    /// The memory of an ended request the item keeps ([`crate::horizon`]).
    pub(crate) memory: Option<Memory>,
}

impl Stored {
    /// The journal's entry for `step`.
    pub(crate) fn step(&self, step: &str) -> Result<Option<Step>, StoreError> {
        self.journal
            .get(step)
            .map(|v| decode_step(v).map_err(|reason| self.corrupt(reason)))
            .transpose()
    }

    /// The journal in step-name order.
    pub(crate) fn steps(&self) -> Result<Vec<StepEntry>, StoreError> {
        let sorted: BTreeMap<&String, &AttributeValue> = self.journal.iter().collect();
        sorted
            .into_iter()
            .map(|(name, v)| {
                let state = match decode_step(v).map_err(|reason| self.corrupt(reason))? {
                    Step::Started { attempt, .. } => StepState::Started { attempt },
                    Step::Done(result) => StepState::Done { result },
                };
                Ok(StepEntry {
                    name: name.clone(),
                    state,
                })
            })
            .collect()
    }

    fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt {
            id: self.id.to_string(),
            reason,
        }
    }
}

/// A journal entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Started by `attempt`, in the write carrying `nonce`.
    Started { attempt: u32, nonce: LeaseToken },
    /// Finished with this result.
    Done(Bytes),
}

pub(crate) fn decode_step(v: &AttributeValue) -> Result<Step, String> {
    let m = v
        .as_m()
        .map_err(|_| "a journal entry is not a map".to_owned())?;
    if let Some(result) = m.get("d") {
        let result = result
            .as_b()
            .map_err(|_| "a step result is not binary".to_owned())?;
        return Ok(Step::Done(Bytes::copy_from_slice(result.as_ref())));
    }
    let attempt = num(m, "a")?;
    let nonce = m
        .get("n")
        .and_then(|t| t.as_s().ok())
        .and_then(|t| LeaseToken::from_hex(t))
        .ok_or("a started step has no nonce")?;
    Ok(Step::Started {
        attempt: u32::try_from(attempt).map_err(|_| "a step's attempt is out of range")?,
        nonce,
    })
}

/// The journal entry for a [`StepState`] an operator's resolution wrote.
/// A resolution only ever finishes a step; a started mark it might carry
/// belongs to no holder.
pub(crate) fn step_value(state: &StepState) -> AttributeValue {
    match state {
        StepState::Started { attempt } => started(*attempt, LeaseToken::from_u128(0)),
        StepState::Done { result } => done(result),
    }
}

/// How responses are stored.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Encoding {
    /// Responses longer than this are compressed with zstd.
    pub(crate) compress_above: usize,
}

impl Encoding {
    /// The response attribute: `rs` raw, or `rz` compressed when that is
    /// shorter.
    pub(crate) fn response(&self, response: &[u8]) -> (&'static str, AttributeValue) {
        if response.len() > self.compress_above {
            if let Ok(packed) = zstd::bulk::compress(response, 3) {
                if packed.len() < response.len() {
                    return ("rz", b(packed));
                }
            }
        }
        ("rs", b(response.to_vec()))
    }
}

/// The attributes of `record` (and the version), without the journal.
pub(crate) fn encode(
    id: &RecordId,
    record: &Record,
    version: u64,
    nonce: Option<LeaseToken>,
    grace_secs: u64,
    encoding: Encoding,
) -> Item {
    let mut item = Item::with_capacity(16);
    item.insert("pk".into(), s(pk(id)));
    item.insert("s".into(), s(id.scope().as_str()));
    item.insert("k".into(), s(id.key().as_str()));
    if let Some(fp) = &record.fingerprint {
        item.insert("fp".into(), s(fp.to_hex()));
    }
    item.insert("at".into(), n(record.attempt));
    item.insert("fe".into(), n(record.fence));
    item.insert("ca".into(), n(record.created_at.as_millis()));
    item.insert("ua".into(), n(record.updated_at.as_millis()));
    item.insert("ex".into(), n(record.expires_at.as_millis()));
    item.insert("sweep_at".into(), n(ttl(record.expires_at, grace_secs)));
    item.insert("v".into(), n(version));
    if let Some(nonce) = nonce {
        item.insert("wn".into(), s(nonce.to_hex()));
    }
    let failure = |item: &mut Item, f: &Failure| {
        item.insert("fc".into(), s(f.class.as_str()));
        item.insert("fm".into(), s(f.message.clone()));
    };
    match &record.state {
        State::InProgress { token, lease_until } => {
            item.insert("st".into(), s("p"));
            item.insert("tk".into(), s(token.to_hex()));
            item.insert("lu".into(), n(lease_until.as_millis()));
        }
        State::Completed { response } => {
            item.insert("st".into(), s("c"));
            let (name, value) = encoding.response(response);
            item.insert(name.into(), value);
        }
        State::Failed { failure: f } => {
            item.insert("st".into(), s("f"));
            failure(&mut item, f);
        }
        State::Released { last_failure } => {
            item.insert("st".into(), s("r"));
            if let Some(f) = last_failure {
                failure(&mut item, f);
            }
        }
    }
    item
}

/// When DynamoDB's own clean-up may delete a record kept until `expires`:
/// `grace_secs` later, so the fence is still there to build on when the
/// key is claimed again soon after it expired.
pub(crate) fn ttl(expires: Timestamp, grace_secs: u64) -> u64 {
    expires
        .as_millis()
        .div_ceil(1000)
        .saturating_add(grace_secs)
}

fn num(item: &HashMap<String, AttributeValue>, name: &str) -> Result<u64, String> {
    let raw = item
        .get(name)
        .ok_or_else(|| format!("attribute {name} is missing"))?
        .as_n()
        .map_err(|_| format!("attribute {name} is not a number"))?;
    raw.parse()
        .map_err(|_| format!("attribute {name} is not an unsigned integer: {raw:?}"))
}

fn text<'a>(item: &'a Item, name: &str) -> Result<&'a str, String> {
    item.get(name)
        .ok_or_else(|| format!("attribute {name} is missing"))?
        .as_s()
        .map(String::as_str)
        .map_err(|_| format!("attribute {name} is not a string"))
}

fn failure_of(item: &Item) -> Result<Option<Failure>, String> {
    if !item.contains_key("fc") {
        return Ok(None);
    }
    let class = text(item, "fc")?;
    let class =
        FailureClass::parse(class).ok_or_else(|| format!("unknown failure class {class:?}"))?;
    Ok(Some(Failure::new(class, text(item, "fm")?)))
}

/// The largest response a stored item may inflate to: what one item can
/// hold, compressed at the best ratio zstd reaches, with room to spare.
const MAX_INFLATED: usize = 64 * 1024 * 1024;

/// Decodes an item. `fallback_id` names it in errors if its own id is
/// unreadable.
pub(crate) fn decode(item: &Item, fallback_id: Option<&RecordId>) -> Result<Stored, StoreError> {
    let id = RecordId::parse(
        text(item, "s").unwrap_or_default(),
        text(item, "k").unwrap_or_default(),
    )
    .ok()
    .or_else(|| fallback_id.cloned());
    let Some(id) = id else {
        return Err(StoreError::Corrupt {
            id: text(item, "pk").unwrap_or("?").replace('\n', "/"),
            reason: "the item's scope and key are unreadable".into(),
        });
    };
    decode_fields(item, &id).map_err(|reason| StoreError::Corrupt {
        id: id.to_string(),
        reason,
    })
}

fn decode_fields(item: &Item, id: &RecordId) -> Result<Stored, String> {
    let stamp = |name: &str| num(item, name).map(Timestamp::from_millis);
    let token = |name: &str| -> Result<LeaseToken, String> {
        LeaseToken::from_hex(text(item, name)?)
            .ok_or_else(|| format!("attribute {name} is not a token"))
    };
    let state = match text(item, "st")? {
        "p" => State::InProgress {
            token: token("tk")?,
            lease_until: stamp("lu")?,
        },
        "c" => {
            let response = if let Some(raw) = item.get("rs") {
                let raw = raw.as_b().map_err(|_| "attribute rs is not binary")?;
                Bytes::copy_from_slice(raw.as_ref())
            } else {
                let packed = item
                    .get("rz")
                    .ok_or("a completed record has no response")?
                    .as_b()
                    .map_err(|_| "attribute rz is not binary")?;
                let inflated = zstd::bulk::decompress(packed.as_ref(), MAX_INFLATED)
                    .map_err(|e| format!("the compressed response does not inflate: {e}"))?;
                Bytes::from(inflated)
            };
            State::Completed { response }
        }
        "f" => State::Failed {
            failure: failure_of(item)?.ok_or("a failed record has no failure")?,
        },
        "r" => State::Released {
            last_failure: failure_of(item)?,
        },
        other => return Err(format!("unknown state {other:?}")),
    };
    let fingerprint = match item.get("fp") {
        None => None,
        Some(_) => Some(
            Fingerprint::from_hex(text(item, "fp")?).ok_or("attribute fp is not a fingerprint")?,
        ),
    };
    let attempt = u32::try_from(num(item, "at")?).map_err(|_| "attribute at is out of range")?;
    let journal = match item.get("j") {
        None => HashMap::new(),
        Some(j) => j.as_m().map_err(|_| "attribute j is not a map")?.clone(),
    };
    Ok(Stored {
        id: id.clone(),
        record: Record {
            state,
            fingerprint,
            attempt,
            fence: num(item, "fe")?,
            created_at: stamp("ca")?,
            updated_at: stamp("ua")?,
            expires_at: stamp("ex")?,
        },
        version: num(item, "v")?,
        nonce: item.get("wn").map(|_| token("wn")).transpose()?,
        journal,
        memory: Memory::of(item)?,
    })
}

/// The size DynamoDB counts for an item: names plus values (an estimate
/// that errs high for numbers).
pub(crate) fn size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, v)| k.len() + 1 + value_size(v))
                .sum::<usize>()
        }
        AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value_size(v)).sum::<usize>(),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> RecordId {
        RecordId::parse("orders", "k-1").expect("valid")
    }

    fn record(state: State) -> Record {
        Record {
            state,
            fingerprint: Some(Fingerprint::of_bytes(b"body")),
            attempt: 3,
            fence: 1_700_000_000_000_123,
            created_at: Timestamp::from_millis(1_000),
            updated_at: Timestamp::from_millis(2_000),
            expires_at: Timestamp::from_millis(3_000_500),
        }
    }

    const PLAIN: Encoding = Encoding {
        compress_above: 1024,
    };

    #[test]
    fn every_state_round_trips() {
        let token = LeaseToken::from_parts(9, 9);
        let big: Vec<u8> = std::iter::repeat_n(b"abcdefgh".as_slice(), 2000)
            .flatten()
            .copied()
            .collect();
        for state in [
            State::InProgress {
                token,
                lease_until: Timestamp::from_millis(5),
            },
            State::Completed {
                response: Bytes::from_static(b"\0\xffok"),
            },
            State::Completed {
                response: Bytes::from(big),
            },
            State::Failed {
                failure: Failure::new(FailureClass::Unknown, "in doubt"),
            },
            State::Released {
                last_failure: Some(Failure::new(FailureClass::Retryable, "later")),
            },
            State::Released { last_failure: None },
        ] {
            let record = record(state);
            let item = encode(&id(), &record, 7, Some(token), 60, PLAIN);
            let stored = decode(&item, None).expect("decodes");
            assert_eq!(stored.record, record);
            assert_eq!((stored.version, stored.nonce), (7, Some(token)));
            assert_eq!(stored.id, id());
        }
    }

    #[test]
    fn long_responses_are_compressed_and_short_ones_are_not() {
        let long = vec![b'x'; 10_000];
        let (name, value) = PLAIN.response(&long);
        assert_eq!(name, "rz");
        assert!(value.as_b().expect("binary").as_ref().len() < 1_000);
        assert_eq!(PLAIN.response(b"short").0, "rs");
        let noise: Vec<u8> = (0..4096).map(|_| rand::random::<u8>()).collect();
        assert_eq!(
            PLAIN.response(&noise).0,
            "rs",
            "incompressible bytes stay raw"
        );
    }

    #[test]
    fn damaged_items_are_corrupt_not_panics() {
        let good = encode(
            &id(),
            &record(State::Released { last_failure: None }),
            1,
            None,
            0,
            PLAIN,
        );
        for (name, value) in [
            ("st", s("x")),
            ("at", s("1")),
            ("fe", n("-1")),
            ("fp", s("zz")),
            ("j", s("no")),
        ] {
            let mut item = good.clone();
            item.insert(name.into(), value);
            let err = decode(&item, None).expect_err(name);
            assert!(matches!(err, StoreError::Corrupt { .. }), "{name}: {err:?}");
        }
        let mut item = good.clone();
        item.remove("v");
        assert!(decode(&item, None).is_err());
        let mut item = good;
        item.insert("st".into(), s("c"));
        item.insert("rz".into(), b(b"not zstd".to_vec()));
        let err = decode(&item, None).expect_err("bad zstd");
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    #[test]
    fn the_ttl_leaves_the_grace_after_expiry() {
        assert_eq!(ttl(Timestamp::from_millis(10_001), 3600), 11 + 3600);
        assert_eq!(ttl(Timestamp::from_millis(10_000), 0), 10);
    }

    #[test]
    fn journal_entries_decode() {
        let token = LeaseToken::from_parts(1, 2);
        assert_eq!(
            decode_step(&started(4, token)),
            Ok(Step::Started {
                attempt: 4,
                nonce: token
            })
        );
        assert_eq!(
            decode_step(&done(b"r")),
            Ok(Step::Done(Bytes::from_static(b"r")))
        );
        assert!(decode_step(&s("x")).is_err());
    }
}
