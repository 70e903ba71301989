//! The claim API's JSON: what callers send and what they get back, as
//! `openapi.yaml` describes it. Durations are whole milliseconds; times
//! are milliseconds since the Unix epoch; responses and step results are
//! any JSON value, stored and replayed byte for byte.

use idem::{FailureClass, Record, State, StepEntry, StepState};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

/// The longest scope a caller may name: what a store keeps, less the
/// longest tenant name and the `/` after it.
pub(crate) const MAX_API_SCOPE_LEN: usize =
    idem::MAX_SCOPE_LEN - super::tenants::MAX_TENANT_LEN - 1;

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
pub(crate) struct LeaseJson {
    pub(crate) scope: String,
    pub(crate) key: String,
    /// The lease token, 32 hex digits.
    pub(crate) token: String,
    /// The claim's fencing number.
    #[serde(deserialize_with = "whole")]
    pub(crate) fence: u64,
    /// Which attempt this is (1 for the first).
    #[serde(deserialize_with = "whole")]
    pub(crate) attempt: u32,
}

/// `POST /v1/claim`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClaimRequest {
    pub(crate) scope: String,
    pub(crate) key: String,
    /// Any text that must stay the same for the key (a digest of the
    /// request, say); a later claim with another is a mismatch.
    #[serde(default)]
    pub(crate) fingerprint: Option<String>,
    #[serde(default, deserialize_with = "whole_or_null")]
    pub(crate) lease_ms: Option<u64>,
    #[serde(default, deserialize_with = "whole_or_null")]
    pub(crate) retention_ms: Option<u64>,
    /// Wait up to this long for a running duplicate's outcome (capped by
    /// the server's `--max-wait`).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub(crate) wait_ms: Option<u64>,
}

/// `POST /v1/complete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteRequest {
    pub(crate) lease: LeaseJson,
    pub(crate) response: Box<RawValue>,
    #[serde(default, deserialize_with = "whole_or_null")]
    pub(crate) retention_ms: Option<u64>,
}

/// A failure's class on the wire.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ClassJson {
    Retryable,
    Terminal,
    Unknown,
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailRequest {
    pub(crate) lease: LeaseJson,
    pub(crate) class: ClassJson,
    pub(crate) message: String,
    #[serde(default, deserialize_with = "whole_or_null")]
    pub(crate) retention_ms: Option<u64>,
}

/// `POST /v1/extend`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExtendRequest {
    pub(crate) lease: LeaseJson,
    /// The new lease from now: the store does not keep the claim's, so
    /// the caller says it each time.
    #[serde(deserialize_with = "whole")]
    pub(crate) lease_ms: u64,
}

/// `POST /v1/release`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseRequest {
    pub(crate) lease: LeaseJson,
}

/// `POST /v1/steps/begin`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepBeginRequest {
    pub(crate) lease: LeaseJson,
    pub(crate) step: String,
}

/// `POST /v1/steps/finish`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepFinishRequest {
    pub(crate) lease: LeaseJson,
    pub(crate) step: String,
    pub(crate) result: Box<RawValue>,
}

/// What a claim found.
#[derive(Debug, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum ClaimAnswer {
    /// Run the work, then complete, fail or release with `lease`.
    Acquired {
        lease: LeaseJson,
        /// An earlier attempt's lease ran out: it may have partly run.
        takeover: bool,
        lease_until_ms: u64,
    },
    /// Someone else holds a live lease.
    InProgress { retry_after_ms: u64 },
    /// Done before: the stored response.
    Completed { response: Box<RawValue> },
    /// Failed for good before.
    Failed {
        class: &'static str,
        message: String,
    },
    /// The key was claimed with another fingerprint.
    Mismatch,
}

/// `POST /v1/extend`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct ExtendAnswer {
    pub(crate) lease_until_ms: u64,
}

/// What `POST /v1/steps/begin` found.
#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum StepBeginAnswer {
    /// Never started: now marked started by this attempt; run it.
    Fresh { downstream_key: String },
    /// An earlier attempt started it and never finished: its outcome is
    /// unknown. Now marked started by this attempt.
    InDoubt {
        attempt: u32,
        downstream_key: String,
    },
    /// Finished before: its result, not to be run again.
    Done { result: Box<RawValue> },
    /// Skipped in doubt by an earlier attempt (at-most-once).
    Skipped,
}

/// One step of `GET /v1/steps`.
#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum StepJson {
    Started { name: String, attempt: u32 },
    Finished { name: String, result: Box<RawValue> },
    Skipped { name: String },
}

/// `GET /v1/steps`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct StepsAnswer {
    pub(crate) steps: Vec<StepJson>,
}

/// `GET /v1/record`'s answer.
#[derive(Debug, Serialize)]
pub(crate) struct RecordAnswer {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) state: &'static str,
    pub(crate) attempt: u32,
    pub(crate) fence: u64,
    pub(crate) created_at_ms: u64,
    pub(crate) updated_at_ms: u64,
    pub(crate) expires_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lease_until_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) response: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) class: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
}

/// Stored bytes as JSON, or why they are not: only `idem serve` writes
/// the records of its tenants, so anything else was written by another
/// program into the same scope.
pub(crate) fn stored_json(bytes: &[u8]) -> Result<Box<RawValue>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8".to_owned())?;
    RawValue::from_string(text.to_owned()).map_err(|e| format!("is not JSON ({e})"))
}

impl RecordAnswer {
    /// A record as the API shows it, under the caller's own scope.
    pub(crate) fn new(scope: &str, key: &str, record: &Record) -> Result<Self, String> {
        let (mut lease_until_ms, mut response, mut class, mut message) = (None, None, None, None);
        match &record.state {
            State::InProgress { lease_until, .. } => lease_until_ms = Some(lease_until.as_millis()),
            State::Completed { response: bytes } => response = Some(stored_json(bytes)?),
            State::Failed { failure } => {
                class = Some(failure.class.as_str());
                message = Some(failure.message.clone());
            }
            State::Released { last_failure } => {
                if let Some(failure) = last_failure {
                    class = Some(failure.class.as_str());
                    message = Some(failure.message.clone());
                }
            }
        }
        Ok(Self {
            scope: scope.to_owned(),
            key: key.to_owned(),
            state: record.state.kind().as_str(),
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
    pub(crate) fn new(entry: StepEntry) -> Result<Self, String> {
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
