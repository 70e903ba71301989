//! The claim API's JSON: what callers send and what they get back, as
//! `idem serve`'s `openapi.yaml` describes it, shared by the server and
//! [`RemoteStore`](crate::RemoteStore). Durations are whole milliseconds;
//! times are milliseconds since the Unix epoch; responses and step results
//! are any JSON value, stored and replayed byte for byte.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use idem::outbox::Message;
use idem::{FailureClass, Key, Record, State, StateKind, StepEntry, StepState};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// A whole number of `T`, sent as JSON's `7` or `7.0` (JSON Schema's
/// `integer` takes both).
fn whole<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    n.as_u64()
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && (0.0..u64::MAX as f64).contains(f))
                .map(|f| f as u64)
        })
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| serde::de::Error::custom(format!("{n} is not a whole number in range")))
}

/// [`whole`], or `None` when absent or `null`.
fn whole_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Whole(#[serde(deserialize_with = "whole")] u64);
    Ok(Option::<Whole>::deserialize(d)?.map(|w| w.0))
}

/// A held claim, as the API hands it out and takes it back: the caller
/// passes it unchanged to every write of the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseJson {
    /// The caller's scope (its tenant's records are apart from others').
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// The lease token, 32 hex digits.
    pub token: String,
    /// The claim's fencing number.
    #[serde(deserialize_with = "whole")]
    pub fence: u64,
    /// Which attempt this is (1 for the first).
    #[serde(deserialize_with = "whole")]
    pub attempt: u32,
}

/// `POST /v1/claim`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The caller's scope (its tenant's records are apart from others').
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// Any text that must stay the same for the key (a digest of the
    /// request, say); a later claim with another is a mismatch.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// The lease in milliseconds (absent: the server's `--lease`).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub lease_ms: Option<u64>,
    /// How long the record is kept, in milliseconds (absent: the server's `--retention`).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub retention_ms: Option<u64>,
    /// Wait up to this long for a running duplicate's outcome (capped by
    /// the server's `--max-wait`).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub wait_ms: Option<u64>,
}

/// `POST /v1/complete`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The held claim, as the claim answered it.
    pub lease: LeaseJson,
    /// The response: any JSON value, replayed byte for byte.
    pub response: Box<RawValue>,
    /// How long the record is kept, in milliseconds (absent: the server's `--retention`).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub retention_ms: Option<u64>,
    /// The messages the run sends: stored with the response, in the same
    /// write, and sent by the server once it is stored (or by a
    /// dispatcher over its store); a duplicate's claim re-sends those not
    /// confirmed sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<MessageJson>,
}

/// Payloads' base64: the standard alphabet, padded; bits after the last
/// byte are not checked.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// A message a run sends, as `complete` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageJson {
    /// Its id (a UUIDv7, or the caller's own key): the broker's
    /// deduplication id and the receiver's idempotency key.
    pub id: String,
    /// Where it goes (a subject, queue or topic), as the server's sender
    /// understands it.
    pub destination: String,
    /// The payload, in base64 (standard alphabet, padded).
    pub payload: String,
    /// The headers, in order, as `[name, value]` pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
}

impl MessageJson {
    /// `message` as the API carries it.
    pub fn new(message: &Message) -> Self {
        Self {
            id: message.id().to_owned(),
            destination: message.destination().to_owned(),
            payload: BASE64.encode(message.payload()),
            headers: message.headers().to_vec(),
        }
    }

    /// The message, or why it is not one (a field named, and the rule).
    pub fn into_message(self) -> Result<Message, String> {
        let id = Key::new(&self.id).map_err(|e| format!("id: {e}"))?;
        let payload = BASE64
            .decode(self.payload.as_bytes())
            .map_err(|e| format!("payload: not base64 ({e})"))?;
        let message = self
            .headers
            .into_iter()
            .fold(
                Message::new(self.destination, payload),
                |m, (name, value)| m.header(name, value),
            )
            .with_id(id);
        message.check().map_err(|e| e.to_string())?;
        Ok(message)
    }
}

/// A failure's class on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassJson {
    /// Retried: the record is released for the next attempt.
    Retryable,
    /// Failed for good: replayed to later claims.
    Terminal,
    /// The outcome is not known: kept for an operator.
    Unknown,
}

impl From<FailureClass> for ClassJson {
    fn from(class: FailureClass) -> Self {
        match class {
            FailureClass::Retryable => ClassJson::Retryable,
            FailureClass::Terminal => ClassJson::Terminal,
            FailureClass::Unknown => ClassJson::Unknown,
        }
    }
}

impl From<ClassJson> for FailureClass {
    fn from(class: ClassJson) -> Self {
        match class {
            ClassJson::Retryable => FailureClass::Retryable,
            ClassJson::Terminal => FailureClass::Terminal,
            ClassJson::Unknown => FailureClass::Unknown,
        }
    }
}

/// `POST /v1/fail`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The held claim, as the claim answered it.
    pub lease: LeaseJson,
    /// The failure's class.
    pub class: ClassJson,
    /// What failed.
    pub message: String,
    /// How long the record is kept, in milliseconds (absent: the server's `--retention`).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub retention_ms: Option<u64>,
}

/// `POST /v1/extend`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    /// The held claim, as the claim answered it.
    pub lease: LeaseJson,
    /// The new lease from now: the store does not keep the claim's, so
    /// the caller says it each time.
    #[serde(deserialize_with = "whole")]
    pub lease_ms: u64,
}

/// `POST /v1/release`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The held claim, as the claim answered it.
    pub lease: LeaseJson,
}

/// `POST /v1/steps/begin`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepBeginRequest {
    /// The held claim, as the claim answered it.
    pub lease: LeaseJson,
    /// The step's name.
    pub step: String,
}

/// `POST /v1/steps/finish`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepFinishRequest {
    /// The held claim, as the claim answered it.
    pub lease: LeaseJson,
    /// The step's name.
    pub step: String,
    /// The step's result: any JSON value.
    pub result: Box<RawValue>,
}

/// What a claim found.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", try_from = "Fields")]
pub enum ClaimAnswer {
    /// Run the work, then complete, fail or release with `lease`.
    Acquired {
        /// The held claim, as the claim answered it.
        lease: LeaseJson,
        /// An earlier attempt's lease ran out: it may have partly run.
        takeover: bool,
        /// When the lease runs out unless extended (milliseconds since the Unix epoch).
        lease_until_ms: u64,
    },
    /// Someone else holds a live lease.
    InProgress {
        /// Until the other holder's lease runs out, in milliseconds.
        retry_after_ms: u64,
    },
    /// Done before: the stored response.
    Completed {
        /// The stored response, byte for byte.
        response: Box<RawValue>,
    },
    /// Failed for good before.
    Failed {
        /// Terminal or unknown.
        class: ClassJson,
        /// What failed.
        message: String,
    },
    /// The key was claimed with another fingerprint.
    Mismatch,
    /// A retry after its key's record expired, remembered by the server's
    /// store: refused, nothing written.
    Forgotten {
        /// When the record expired (milliseconds since the Unix epoch).
        expired_at_ms: u64,
    },
}

/// `POST /v1/extend`'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct ExtendAnswer {
    /// When the lease runs out unless extended (milliseconds since the Unix epoch).
    pub lease_until_ms: u64,
}

/// What `POST /v1/steps/begin` found.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", try_from = "Fields")]
pub enum StepBeginAnswer {
    /// Never started: now marked started by this attempt; run it.
    Fresh {
        /// The key to give the step's downstream call, the same on every attempt.
        downstream_key: String,
    },
    /// An earlier attempt started it and never finished: its outcome is
    /// unknown. Now marked started by this attempt.
    InDoubt {
        /// The attempt.
        attempt: u32,
        /// The key to give the step's downstream call, the same on every attempt.
        downstream_key: String,
    },
    /// Finished before: its result, not to be run again.
    Done {
        /// The step's journaled result.
        result: Box<RawValue>,
    },
    /// Skipped in doubt by an earlier attempt (at-most-once).
    Skipped,
}

/// One step of `GET /v1/steps`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", try_from = "Fields")]
pub enum StepJson {
    /// Started by `attempt` and not finished.
    Started {
        /// The step's name.
        name: String,
        /// The attempt that started it.
        attempt: u32,
    },
    /// Finished, with its result.
    Finished {
        /// The step's name.
        name: String,
        /// Its journaled result.
        result: Box<RawValue>,
    },
    /// Skipped in doubt (at-most-once).
    Skipped {
        /// The step's name.
        name: String,
    },
}

/// `GET /v1/steps`'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct StepsAnswer {
    /// The journal, in step-name order.
    pub steps: Vec<StepJson>,
}

/// `GET /v1/record`'s answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct RecordAnswer {
    /// The caller's scope (its tenant's records are apart from others').
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    /// Where the record is in its life.
    pub state: StateJson,
    /// The attempt.
    pub attempt: u32,
    /// The record's latest fencing number.
    pub fence: u64,
    /// When the record was first claimed (milliseconds since the Unix epoch).
    pub created_at_ms: u64,
    /// When the record last changed (milliseconds since the Unix epoch).
    pub updated_at_ms: u64,
    /// When the record expires (milliseconds since the Unix epoch).
    pub expires_at_ms: u64,
    /// When the lease runs out unless extended (milliseconds since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_until_ms: Option<u64>,
    /// The response: any JSON value, replayed byte for byte.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub response: Option<Box<RawValue>>,
    /// The failure's class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<ClassJson>,
    /// What failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A record's state on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateJson {
    /// Claimed and not finished.
    InProgress,
    /// Done; its response is replayed.
    Completed,
    /// Failed for good; replayed.
    Failed,
    /// Given back; the next claim runs it.
    Released,
}

impl From<StateKind> for StateJson {
    fn from(kind: StateKind) -> Self {
        match kind {
            StateKind::InProgress => StateJson::InProgress,
            StateKind::Completed => StateJson::Completed,
            StateKind::Failed => StateJson::Failed,
            StateKind::Released => StateJson::Released,
        }
    }
}

/// Stored bytes as JSON, or why they are not: only `idem serve` writes
/// the records of its tenants, so anything else was written by another
/// program into the same scope.
pub fn stored_json(bytes: &[u8]) -> Result<Box<RawValue>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8".to_owned())?;
    RawValue::from_string(text.to_owned()).map_err(|e| format!("is not JSON ({e})"))
}

impl RecordAnswer {
    /// A record as the API shows it, under the caller's own scope.
    pub fn new(scope: &str, key: &str, record: &Record) -> Result<Self, String> {
        let (mut lease_until_ms, mut response, mut class, mut message) = (None, None, None, None);
        match &record.state {
            State::InProgress { lease_until, .. } => lease_until_ms = Some(lease_until.as_millis()),
            State::Completed { response: bytes } => response = Some(stored_json(bytes)?),
            State::Failed { failure } => {
                class = Some(failure.class.into());
                message = Some(failure.message.clone());
            }
            State::Released { last_failure } => {
                if let Some(failure) = last_failure {
                    class = Some(failure.class.into());
                    message = Some(failure.message.clone());
                }
            }
        }
        Ok(Self {
            scope: scope.to_owned(),
            key: key.to_owned(),
            state: record.state.kind().into(),
            attempt: record.attempt,
            fence: record.fence,
            created_at_ms: record.created_at.as_millis(),
            updated_at_ms: record.updated_at.as_millis(),
            expires_at_ms: record.expires_at.as_millis(),
            lease_until_ms,
            response,
            class,
            message,
        })
    }
}

impl StepJson {
    /// A journal entry as the API shows it.
    pub fn new(entry: StepEntry) -> Result<Self, String> {
        Ok(match entry.state {
            StepState::Started { attempt } => StepJson::Started {
                name: entry.name,
                attempt,
            },
            StepState::Done { result } if result.is_empty() => {
                StepJson::Skipped { name: entry.name }
            }
            StepState::Done { result } => StepJson::Finished {
                result: stored_json(&result)?,
                name: entry.name,
            },
        })
    }
}

/// A JSON value that is there, `null` included (an `Option<Box<RawValue>>`
/// would read `null` as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// Every field of the tagged answers, read as one object: serde cannot
/// read a [`RawValue`] inside an internally tagged enum, so the answers
/// are read through this and checked field by field.
#[derive(Deserialize)]
struct Fields {
    outcome: Option<String>,
    state: Option<String>,
    lease: Option<LeaseJson>,
    takeover: Option<bool>,
    lease_until_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    response: Option<Box<RawValue>>,
    #[serde(default, deserialize_with = "present")]
    result: Option<Box<RawValue>>,
    class: Option<ClassJson>,
    message: Option<String>,
    attempt: Option<u32>,
    downstream_key: Option<String>,
    name: Option<String>,
    expired_at_ms: Option<u64>,
}

/// `field`, or why the answer is not what the API sends.
fn need<T>(field: Option<T>, name: &str, of: &str) -> Result<T, String> {
    field.ok_or_else(|| format!("{of} without its {name}"))
}

impl TryFrom<Fields> for ClaimAnswer {
    type Error = String;

    fn try_from(f: Fields) -> Result<Self, String> {
        let of = "claim answer";
        Ok(match need(f.outcome, "outcome", of)?.as_str() {
            "acquired" => ClaimAnswer::Acquired {
                lease: need(f.lease, "lease", of)?,
                takeover: need(f.takeover, "takeover", of)?,
                lease_until_ms: need(f.lease_until_ms, "lease_until_ms", of)?,
            },
            "in_progress" => ClaimAnswer::InProgress {
                retry_after_ms: need(f.retry_after_ms, "retry_after_ms", of)?,
            },
            "completed" => ClaimAnswer::Completed {
                response: need(f.response, "response", of)?,
            },
            "failed" => ClaimAnswer::Failed {
                class: need(f.class, "class", of)?,
                message: need(f.message, "message", of)?,
            },
            "mismatch" => ClaimAnswer::Mismatch,
            "forgotten" => ClaimAnswer::Forgotten {
                expired_at_ms: need(f.expired_at_ms, "expired_at_ms", of)?,
            },
            other => return Err(format!("unknown claim outcome {other:?}")),
        })
    }
}

impl TryFrom<Fields> for StepBeginAnswer {
    type Error = String;

    fn try_from(f: Fields) -> Result<Self, String> {
        let of = "step answer";
        Ok(match need(f.state, "state", of)?.as_str() {
            "fresh" => StepBeginAnswer::Fresh {
                downstream_key: need(f.downstream_key, "downstream_key", of)?,
            },
            "in_doubt" => StepBeginAnswer::InDoubt {
                attempt: need(f.attempt, "attempt", of)?,
                downstream_key: need(f.downstream_key, "downstream_key", of)?,
            },
            "done" => StepBeginAnswer::Done {
                result: need(f.result, "result", of)?,
            },
            "skipped" => StepBeginAnswer::Skipped,
            other => return Err(format!("unknown step state {other:?}")),
        })
    }
}

impl TryFrom<Fields> for StepJson {
    type Error = String;

    fn try_from(f: Fields) -> Result<Self, String> {
        let of = "journal entry";
        let name = need(f.name, "name", of)?;
        Ok(match need(f.state, "state", of)?.as_str() {
            "started" => StepJson::Started {
                name,
                attempt: need(f.attempt, "attempt", of)?,
            },
            "finished" => StepJson::Finished {
                name,
                result: need(f.result, "result", of)?,
            },
            "skipped" => StepJson::Skipped { name },
            other => return Err(format!("unknown step state {other:?}")),
        })
    }
}
