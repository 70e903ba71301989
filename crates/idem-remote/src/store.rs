//! [`RemoteStore`] as a [`Store`]: each primitive is one call of the claim
//! API, and its answer the primitive's.

use std::time::Duration;

use bytes::Bytes;
use idem::codec::AtRest;
use idem::store::{poll_while, ClaimOutcome, ClaimParams, Lease, LeaseToken, StepBegin};
use idem::{
    Failure, GetRecord, Record, RecordId, Resolution, Resolved, State, StepEntry, StepJournal,
    StepState, Store, StoreError, Timestamp,
};
use serde_json::value::RawValue;

use crate::wire::{
    ClaimAnswer, ClaimRequest, ClassJson, CompleteRequest, ExtendAnswer, ExtendRequest,
    FailRequest, LeaseJson, MessageJson, RecordAnswer, ReleaseRequest, StateJson, StepBeginAnswer,
    StepBeginRequest, StepFinishRequest, StepJson, StepsAnswer,
};
use crate::RemoteStore;

/// The longest duration the API takes: a century, in milliseconds.
const MAX_MILLIS: u64 = 3_153_600_000_000;

/// `d` in whole milliseconds, at least 1 and at most what the API takes
/// (configuration may say `Duration::MAX` for "forever").
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).map_or(MAX_MILLIS, |ms| ms.clamp(1, MAX_MILLIS))
}

/// `lease` as the API takes it back.
fn lease_json(lease: &Lease) -> LeaseJson {
    LeaseJson {
        scope: lease.id.scope().as_str().to_owned(),
        key: lease.id.key().as_str().to_owned(),
        token: lease.token.to_hex(),
        fence: lease.fence,
        attempt: lease.attempt,
    }
}

/// A reply that is not what the API sends.
fn garbled(what: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("idem serve answered {what}").into())
}

/// `json` as a stored response: the plain envelope the executor opens.
fn enveloped(json: &RawValue) -> Bytes {
    idem::codec::plain(json.get().as_bytes())
}

/// A stored or journaled value as the JSON the API takes.
fn as_json(bytes: Bytes, what: &str) -> Result<Box<RawValue>, StoreError> {
    String::from_utf8(bytes.into())
        .ok()
        .and_then(|text| RawValue::from_string(text).ok())
        .ok_or_else(|| {
            StoreError::Backend(
                format!(
                    "{what} is not JSON: over idem serve, responses and step results are JSON \
                     (use the executor's default Json codec)"
                )
                .into(),
            )
        })
}

impl Store for RemoteStore {
    /// The server keeps the JSON inside the envelope, not the envelope.
    fn keeps_bytes(&self) -> bool {
        false
    }

    /// A run's messages go with its completion; the server keeps them
    /// with the result and sends them.
    fn sends_messages(&self) -> bool {
        true
    }

    idem::store_capabilities!(peek, steps);

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        let request = ClaimRequest {
            scope: id.scope().as_str().to_owned(),
            key: id.key().as_str().to_owned(),
            fingerprint: params.fingerprint.map(|f| f.to_hex()),
            lease_ms: Some(millis(params.lease)),
            retention_ms: Some(millis(params.retention)),
            wait_ms: None,
        };
        let answer: ClaimAnswer = self.api.post("/v1/claim", &request).await?;
        Ok(match answer {
            ClaimAnswer::Acquired {
                lease,
                takeover,
                lease_until_ms,
            } => {
                if lease.scope != request.scope || lease.key != request.key {
                    return Err(garbled(format_args!(
                        "a lease on {}/{} to a claim of {id}",
                        lease.scope, lease.key
                    )));
                }
                ClaimOutcome::Acquired(Lease {
                    id: id.clone(),
                    token: LeaseToken::from_hex(&lease.token).ok_or_else(|| {
                        garbled(format_args!("the lease token {:?}", lease.token))
                    })?,
                    fence: lease.fence,
                    attempt: lease.attempt,
                    takeover,
                    lease_until: Timestamp::from_millis(lease_until_ms),
                })
            }
            ClaimAnswer::InProgress { retry_after_ms } => ClaimOutcome::InProgress {
                retry_after: Duration::from_millis(retry_after_ms),
            },
            ClaimAnswer::Completed { response } => ClaimOutcome::Completed(enveloped(&response)),
            ClaimAnswer::Failed { class, message } => {
                ClaimOutcome::Failed(Failure::new(class.into(), message))
            }
            ClaimAnswer::Mismatch => ClaimOutcome::Mismatch,
            ClaimAnswer::Forgotten { expired_at_ms } => ClaimOutcome::Forgotten {
                expired_at: Timestamp::from_millis(expired_at_ms),
            },
        })
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let opened = idem::codec::open(&response, usize::MAX)
            .map_err(|reason| StoreError::Backend(reason.into()))?;
        let messages = idem::outbox::stored_messages(&AtRest::reader(None), &lease.id, &response)
            .map_err(|reason| StoreError::Backend(reason.into()))?;
        let request = CompleteRequest {
            lease: lease_json(lease),
            response: as_json(Bytes::copy_from_slice(&opened), "the response")?,
            retention_ms: Some(millis(retention)),
            messages: messages.iter().map(MessageJson::new).collect(),
        };
        self.api.post_empty("/v1/complete", &request).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let request = FailRequest {
            lease: lease_json(lease),
            class: ClassJson::from(failure.class),
            message: failure.message,
            retention_ms: Some(millis(retention)),
        };
        self.api.post_empty("/v1/fail", &request).await
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        let request = ExtendRequest {
            lease: lease_json(lease),
            lease_ms: millis(duration),
        };
        let answer: ExtendAnswer = self.api.post("/v1/extend", &request).await?;
        Ok(Timestamp::from_millis(answer.lease_until_ms))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let request = ReleaseRequest {
            lease: lease_json(lease),
        };
        self.api.post_empty("/v1/release", &request).await
    }

    /// Reads the record until it is no longer in progress: the claim API
    /// has no notification, so this polls with a backoff (5 ms to 200 ms).
    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        poll_while(timeout, || async {
            matches!(
                self.get(id).await,
                Ok(Some(Record {
                    state: State::InProgress { .. },
                    ..
                }))
            )
        })
        .await;
    }
}

impl GetRecord for RemoteStore {
    /// The record as the API shows it: an in-progress record's lease
    /// token is not shown (it reads as zero), nor the fingerprint.
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let query = [("scope", id.scope().as_str()), ("key", id.key().as_str())];
        let Some(answer) = self.api.get::<RecordAnswer>("/v1/record", &query).await? else {
            return Ok(None);
        };
        let failure = || {
            answer
                .class
                .map(|class| Failure::new(class.into(), answer.message.clone().unwrap_or_default()))
        };
        let state = match answer.state {
            StateJson::InProgress => State::InProgress {
                token: LeaseToken::from_u128(0),
                lease_until: Timestamp::from_millis(answer.lease_until_ms.unwrap_or_default()),
            },
            StateJson::Completed => State::Completed {
                response: enveloped(
                    answer
                        .response
                        .as_deref()
                        .ok_or_else(|| garbled("a completed record without its response"))?,
                ),
            },
            StateJson::Failed => State::Failed {
                failure: failure().ok_or_else(|| garbled("a failed record without its class"))?,
            },
            StateJson::Released => State::Released {
                last_failure: failure(),
            },
        };
        Ok(Some(Record {
            state,
            fingerprint: None,
            attempt: answer.attempt,
            fence: answer.fence,
            created_at: Timestamp::from_millis(answer.created_at_ms),
            updated_at: Timestamp::from_millis(answer.updated_at_ms),
            expires_at: Timestamp::from_millis(answer.expires_at_ms),
        }))
    }
}

impl StepJournal for RemoteStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let request = StepBeginRequest {
            lease: lease_json(lease),
            step: step.to_owned(),
        };
        let answer: StepBeginAnswer = self.api.post("/v1/steps/begin", &request).await?;
        Ok(match answer {
            StepBeginAnswer::Fresh { .. } => StepBegin::Fresh,
            StepBeginAnswer::InDoubt { attempt, .. } => StepBegin::InDoubt { attempt },
            StepBeginAnswer::Done { result } => {
                StepBegin::Done(Bytes::copy_from_slice(result.get().as_bytes()))
            }
            StepBeginAnswer::Skipped => StepBegin::Done(Bytes::new()),
        })
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        if result.is_empty() {
            return Err(StoreError::Backend(
                "the claim API journals results, not skipped steps: a step in doubt is skipped \
                 over idem serve only by parking the run"
                    .into(),
            ));
        }
        let request = StepFinishRequest {
            lease: lease_json(lease),
            step: step.to_owned(),
            result: as_json(result, "the step's result")?,
        };
        self.api.post_empty("/v1/steps/finish", &request).await
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        let query = [("scope", id.scope().as_str()), ("key", id.key().as_str())];
        let Some(answer) = self.api.get::<StepsAnswer>("/v1/steps", &query).await? else {
            return Ok(Vec::new());
        };
        Ok(answer
            .steps
            .into_iter()
            .map(|entry| match entry {
                StepJson::Started { name, attempt } => StepEntry {
                    name,
                    state: StepState::Started { attempt },
                },
                StepJson::Finished { name, result } => StepEntry {
                    name,
                    state: StepState::Done {
                        result: Bytes::copy_from_slice(result.get().as_bytes()),
                    },
                },
                StepJson::Skipped { name } => StepEntry {
                    name,
                    state: StepState::Done {
                        result: Bytes::new(),
                    },
                },
            })
            .collect())
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let _ = (id, step, resolution);
        Err(StoreError::Backend(
            "an operator resolves a parked step with `idem resolve` against the store itself, \
             not over the claim API"
                .into(),
        ))
    }
}
