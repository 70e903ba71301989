//! The claim API's operations over a store: each takes a tenant and a
//! checked request, and answers JSON or a problem.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use idem::outbox::Message;
use idem::store::{ClaimOutcome, ClaimParams, Lease, LeaseToken, StepBegin, LONGEST_HELD};
use idem::{
    Failure, Fingerprint, GetRecord, Idempotency, KeyRules, RecordId, Scope, State, StepJournal,
    StepState, Store, StoreError, Timestamp, MAX_SCOPE_LEN,
};
use idem_http::Problem;
use idem_remote::wire::{
    stored_json, ClaimAnswer, ClaimRequest, CompleteRequest, ExtendAnswer, ExtendRequest,
    FailRequest, LeaseJson, MessageJson, RecordAnswer, ReleaseRequest, StepBeginAnswer,
    StepBeginRequest, StepFinishRequest, StepJson, StepsAnswer,
};
use serde_json::value::RawValue;
use tokio_util::task::TaskTracker;

use super::problems::{self, bad_request, store_problem};
use super::tenants::MAX_TENANT_LEN;
use super::ServeConfig;
use crate::store::AnyStore;

/// The longest scope a caller may name: what a store keeps, less the
/// longest tenant name and the `/` after it.
const MAX_API_SCOPE_LEN: usize = MAX_SCOPE_LEN - MAX_TENANT_LEN - 1;

/// The API's state: the store, the settings, and the writes still
/// running for callers that went away.
pub(crate) struct Api {
    pub(crate) store: AnyStore,
    pub(crate) config: ServeConfig,
    /// Writes run detached from their request, so that a caller that
    /// disconnects cannot cut one short; shutdown waits for them.
    pub(crate) writes: TaskTracker,
    /// Keeps the messages runs send (markers, registry) and sends them.
    pub(crate) outbox: Outbox,
}

/// The executor the API keeps and sends runs' messages through.
pub(crate) type Outbox = Idempotency<AnyStore>;

type Answer<T> = Result<T, Problem>;

impl Api {
    /// The record `key` of the caller's `scope`, kept under its tenant.
    fn id(&self, tenant: &str, scope: &str, key: &str) -> Answer<RecordId> {
        Scope::new(scope).map_err(|e| bad_request(format!("scope: {e}")))?;
        if scope.len() > MAX_API_SCOPE_LEN {
            return Err(bad_request(format!(
                "scope: longer than {MAX_API_SCOPE_LEN} bytes (the store's {MAX_SCOPE_LEN}, \
                 less room for the tenant's name)"
            )));
        }
        let key = KeyRules::default()
            .parse(key)
            .map_err(|e| bad_request(format!("key: {e}")))?;
        let scope = Scope::new(&format!("{tenant}/{scope}"))
            .map_err(|e| bad_request(format!("scope: {e}")))?;
        Ok(self.config.secrets.stored_id(&RecordId::new(scope, key)))
    }

    /// The JSON of a result stored for `id` (opened if it was sealed).
    fn result_json(&self, id: &RecordId, stored: &[u8]) -> Answer<Box<RawValue>> {
        let opened = self
            .config
            .secrets
            .open_result(id, stored)
            .map_err(problems::unreadable)?;
        stored_json(&opened).map_err(problems::unreadable)
    }

    /// The lease a caller passed back.
    fn lease(&self, tenant: &str, lease: &LeaseJson) -> Answer<Lease> {
        let token = LeaseToken::from_hex(&lease.token)
            .ok_or_else(|| bad_request("lease.token: not the 32 hex digits a claim hands out"))?;
        Ok(Lease {
            id: self.id(tenant, &lease.scope, &lease.key)?,
            token,
            fence: lease.fence,
            attempt: lease.attempt,
            takeover: false,
            lease_until: Timestamp::ZERO,
        })
    }

    /// A lease asked for (the server's `--lease` when not): at most
    /// `--max-lease`.
    fn lease_ms(&self, asked: Option<u64>) -> Answer<Duration> {
        let lease = millis("lease_ms", asked, self.config.lease)?;
        if lease > self.config.max_lease {
            return Err(bad_request(format!(
                "lease_ms: {} is over the server's --max-lease ({} ms); extend a shorter \
                 lease while the work runs",
                lease.as_millis(),
                self.config.max_lease.as_millis()
            )));
        }
        Ok(lease)
    }

    /// Runs a write to its end even if the caller goes away meanwhile.
    async fn detached<T: Send + 'static>(
        &self,
        write: impl std::future::Future<Output = Answer<T>> + Send + 'static,
    ) -> Answer<T> {
        self.writes.spawn(write).await.map_err(|e| {
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                problems::STORE_ERROR,
                "store error",
                format!("the write stopped: {e}"),
            )
        })?
    }

    pub(crate) async fn claim(&self, tenant: &str, request: ClaimRequest) -> Answer<ClaimAnswer> {
        let id = self.id(tenant, &request.scope, &request.key)?;
        let lease = self.lease_ms(request.lease_ms)?;
        let retention = millis("retention_ms", request.retention_ms, self.config.retention)?;
        let mut params = ClaimParams::new(lease, retention.max(lease));
        if let Some(fingerprint) = &request.fingerprint {
            params = params.fingerprint(Fingerprint::of_bytes(fingerprint.as_bytes()));
        }
        let wait = match request.wait_ms {
            None | Some(0) => Duration::ZERO,
            Some(ms) => millis("wait_ms", Some(ms), Duration::ZERO)?.min(self.config.max_wait),
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let outcome = self
                .store
                .claim(&id, &params)
                .await
                .map_err(store_problem)?;
            return Ok(match outcome {
                ClaimOutcome::Acquired(lease) => ClaimAnswer::Acquired {
                    lease: LeaseJson {
                        scope: request.scope,
                        key: request.key,
                        token: lease.token.to_hex(),
                        fence: lease.fence,
                        attempt: lease.attempt,
                    },
                    takeover: lease.takeover,
                    lease_until_ms: lease.lease_until.as_millis(),
                },
                ClaimOutcome::InProgress { retry_after } => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if !left.is_zero() {
                        self.store
                            .wait_for_change(&id, left.min(retry_after.max(MIN_POLL)))
                            .await;
                        continue;
                    }
                    ClaimAnswer::InProgress {
                        retry_after_ms: retry_after.as_millis().try_into().unwrap_or(u64::MAX),
                    }
                }
                ClaimOutcome::Completed(response) => {
                    let answer = ClaimAnswer::Completed {
                        response: self.result_json(&id, &response)?,
                    };
                    self.redispatch(id, response);
                    answer
                }
                ClaimOutcome::Failed(failure) => ClaimAnswer::Failed {
                    class: failure.class.into(),
                    message: failure.message,
                },
                ClaimOutcome::Mismatch => ClaimAnswer::Mismatch,
                ClaimOutcome::Forgotten { expired_at } => ClaimAnswer::Forgotten {
                    expired_at_ms: expired_at.as_millis(),
                },
            });
        }
    }

    /// A duplicate answered with a stored completion: its messages sent
    /// again, in the background, if no dispatch of them is confirmed.
    /// Only the envelopes that can carry messages are looked at: a result
    /// stored as plain JSON sent none.
    fn redispatch(&self, id: RecordId, stored: Bytes) {
        if !matches!(
            idem::codec::envelope_of(&stored).0,
            "with-messages" | "sealed"
        ) {
            return;
        }
        let outbox = self.outbox.clone();
        self.writes
            .spawn(async move { outbox.redispatch_stored(&id, &stored).await });
    }

    pub(crate) async fn complete(&self, tenant: &str, request: CompleteRequest) -> Answer<()> {
        let lease = self.lease(tenant, &request.lease)?;
        let retention = millis("retention_ms", request.retention_ms, self.config.retention)?;
        let messages = messages(request.messages)?;
        let json = Bytes::from(String::from(Box::<str>::from(request.response)));
        let response = self
            .config
            .secrets
            .seal_run(&lease.id, json.clone(), &messages);
        let store = self.store.clone();
        let secrets = self.config.secrets.clone();
        let outbox = self.outbox.clone();
        let writes = self.writes.clone();
        self.detached(async move {
            if let Some(limit) = store.max_stored_bytes().filter(|l| response.len() > *l) {
                let refusal = StoreError::Backend(
                    format!(
                        "a result of {} bytes as stored exceeds the {limit} bytes this store keeps",
                        response.len()
                    )
                    .into(),
                );
                return Err(end_refused(&store, &lease, &refusal, retention).await);
            }
            // Claimed before the completion, so that once the messages
            // are stored a dispatcher always finds them.
            let marker = match messages.is_empty() {
                true => None,
                false => Some(outbox.hold_outbox_marker(&lease.id).await),
            };
            match store.complete(&lease, response.clone(), retention).await {
                Err(refusal) if refusal.is_refusal() => {
                    Err(end_refused(&store, &lease, &refusal, retention).await)
                }
                done => {
                    // An earlier try's bytes, sealed under another nonce,
                    // are the same result once opened.
                    landed(&store, &lease, done, |state| match state {
                        State::Completed { response: stored } => secrets
                            .open_result(&lease.id, stored)
                            .is_ok_and(|opened| *opened == *json),
                        _ => false,
                    })
                    .await?;
                    if let Some(marker) = marker {
                        writes.spawn(async move {
                            outbox.dispatch_held(&messages, marker, retention).await
                        });
                    }
                    Ok(())
                }
            }
        })
        .await
    }

    pub(crate) async fn fail(&self, tenant: &str, request: FailRequest) -> Answer<()> {
        let lease = self.lease(tenant, &request.lease)?;
        let retention = millis("retention_ms", request.retention_ms, self.config.retention)?;
        let failure = Failure::new(request.class.into(), request.message);
        let store = self.store.clone();
        self.detached(async move {
            let done = store.fail(&lease, failure.clone(), retention).await;
            landed(&store, &lease, done, |state| match state {
                State::Failed { failure: stored } => *stored == failure,
                State::Released {
                    last_failure: Some(stored),
                } => *stored == failure,
                _ => false,
            })
            .await
        })
        .await
    }

    pub(crate) async fn extend(
        &self,
        tenant: &str,
        request: ExtendRequest,
    ) -> Answer<ExtendAnswer> {
        let lease = self.lease(tenant, &request.lease)?;
        let duration = self.lease_ms(Some(request.lease_ms))?;
        let until = self
            .store
            .extend(&lease, duration)
            .await
            .map_err(store_problem)?;
        Ok(ExtendAnswer {
            lease_until_ms: until.as_millis(),
        })
    }

    pub(crate) async fn release(&self, tenant: &str, request: ReleaseRequest) -> Answer<()> {
        let lease = self.lease(tenant, &request.lease)?;
        let store = self.store.clone();
        self.detached(async move {
            let done = store.release(&lease).await;
            landed(&store, &lease, done, |state| {
                matches!(state, State::Released { last_failure: None })
            })
            .await
        })
        .await
    }

    pub(crate) async fn begin_step(
        &self,
        tenant: &str,
        request: StepBeginRequest,
    ) -> Answer<StepBeginAnswer> {
        let lease = self.lease(tenant, &request.lease)?;
        step_name(&request.step)?;
        let downstream_key = idem::step::downstream_key(&lease.id, &request.step);
        let begun = StepJournal::begin_step(&self.store, &lease, &request.step)
            .await
            .map_err(store_problem)?;
        Ok(match begun {
            StepBegin::Fresh => StepBeginAnswer::Fresh { downstream_key },
            StepBegin::InDoubt { attempt } => StepBeginAnswer::InDoubt {
                attempt,
                downstream_key,
            },
            StepBegin::Done(result) if result.is_empty() => StepBeginAnswer::Skipped,
            StepBegin::Done(result) => StepBeginAnswer::Done {
                result: {
                    let opened = self
                        .config
                        .secrets
                        .at_rest()
                        .open_step(&lease.id, &request.step, &result)
                        .map_err(problems::unreadable)?;
                    stored_json(&opened).map_err(problems::unreadable)?
                },
            },
        })
    }

    pub(crate) async fn finish_step(&self, tenant: &str, request: StepFinishRequest) -> Answer<()> {
        let lease = self.lease(tenant, &request.lease)?;
        step_name(&request.step)?;
        let json = Bytes::from(String::from(Box::<str>::from(request.result)));
        let result =
            self.config
                .secrets
                .at_rest()
                .seal_step(&lease.id, &request.step, json.clone());
        let store = self.store.clone();
        let secrets = self.config.secrets.clone();
        self.detached(async move {
            let step = request.step;
            match StepJournal::finish_step(&store, &lease, &step, result.clone()).await {
                // Its own earlier try, whose answer was lost, may have
                // journaled it before the lease was lost.
                Err(StoreError::LeaseLost) => {
                    let journaled = StepJournal::steps(&store, &lease.id)
                        .await
                        .map_err(store_problem)?
                        .into_iter()
                        .any(|e| {
                            e.name == step
                                && matches!(&e.state, StepState::Done { result: r }
                                    if secrets.at_rest().open_step(&lease.id, &step, r)
                                        .is_ok_and(|opened| *opened == *json))
                        });
                    let same_claim = GetRecord::get(&store, &lease.id)
                        .await
                        .map_err(store_problem)?
                        .is_some_and(|r| r.fence == lease.fence);
                    if journaled && same_claim {
                        Ok(())
                    } else {
                        Err(store_problem(StoreError::LeaseLost))
                    }
                }
                other => other.map_err(store_problem),
            }
        })
        .await
    }

    pub(crate) async fn record(
        &self,
        tenant: &str,
        scope: &str,
        key: &str,
    ) -> Answer<RecordAnswer> {
        let id = self.id(tenant, scope, key)?;
        let mut record = GetRecord::get(&self.store, &id)
            .await
            .map_err(store_problem)?
            .ok_or_else(|| problems::not_found(scope, key))?;
        if let State::Completed { response } = &mut record.state {
            let opened = self
                .config
                .secrets
                .open_result(&id, response)
                .map_err(problems::unreadable)?;
            *response = Bytes::copy_from_slice(&opened);
        }
        RecordAnswer::new(scope, key, &record).map_err(problems::unreadable)
    }

    pub(crate) async fn steps(&self, tenant: &str, scope: &str, key: &str) -> Answer<StepsAnswer> {
        let id = self.id(tenant, scope, key)?;
        let entries = StepJournal::steps(&self.store, &id)
            .await
            .map_err(store_problem)?;
        let steps = entries
            .into_iter()
            .map(|mut entry| {
                if let StepState::Done { result } = &mut entry.state {
                    if !result.is_empty() {
                        let opened =
                            self.config
                                .secrets
                                .at_rest()
                                .open_step(&id, &entry.name, result)?;
                        *result = Bytes::copy_from_slice(&opened);
                    }
                }
                StepJson::new(entry)
            })
            .collect::<Result<_, _>>()
            .map_err(problems::unreadable)?;
        Ok(StepsAnswer { steps })
    }
}

/// The shortest pause between two claims of a key held elsewhere while a
/// claim waits, for stores that wake waiters early.
const MIN_POLL: Duration = Duration::from_millis(5);

/// A duration field, in whole milliseconds: its default when absent,
/// refused when zero or longer than idem keeps anything.
fn millis(field: &str, value: Option<u64>, default: Duration) -> Answer<Duration> {
    let Some(ms) = value else {
        return Ok(default);
    };
    let d = Duration::from_millis(ms);
    if ms == 0 || d > LONGEST_HELD {
        return Err(bad_request(format!(
            "{field}: {ms} is outside 1..={} (a century, the longest idem keeps anything)",
            LONGEST_HELD.as_millis()
        )));
    }
    Ok(d)
}

/// The messages a completion carries, checked: at most
/// [`MAX_MESSAGES_BYTES`](idem::outbox::MAX_MESSAGES_BYTES) in all.
fn messages(sent: Vec<MessageJson>) -> Answer<Vec<Message>> {
    let messages = sent
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            m.into_message()
                .map_err(|e| bad_request(format!("messages[{i}].{e}")))
        })
        .collect::<Answer<Vec<Message>>>()?;
    let bytes: usize = messages.iter().map(Message::stored_size).sum();
    if bytes > idem::outbox::MAX_MESSAGES_BYTES {
        return Err(bad_request(format!(
            "messages: {bytes} bytes, over the {} a run may send",
            idem::outbox::MAX_MESSAGES_BYTES
        )));
    }
    Ok(messages)
}

fn step_name(name: &str) -> Answer<()> {
    idem::step::check_step_name(name).map_err(|rule| bad_request(format!("step: {rule}")))
}

/// A write's result, where a lost lease may be the caller's own earlier
/// try of the same write (its answer lost on the way back): the record
/// then holds the claim's fence in the state the write leaves, and the
/// write is reported as done, not as a lost lease.
async fn landed(
    store: &AnyStore,
    lease: &Lease,
    done: Result<(), StoreError>,
    leaves: impl Fn(&State) -> bool,
) -> Answer<()> {
    match done {
        Err(StoreError::LeaseLost) => {
            let record = GetRecord::get(store, &lease.id)
                .await
                .map_err(store_problem)?;
            match record {
                Some(record) if record.fence == lease.fence && leaves(&record.state) => Ok(()),
                _ => Err(store_problem(StoreError::LeaseLost)),
            }
        }
        other => other.map_err(store_problem),
    }
}

/// Ends a claim whose result the store refused (too large for it, invalid)
/// as the executor does: the work ran, so the record is failed, terminal,
/// with the reason (cut short if the store refuses the whole message), and
/// never left claimed to be taken over and run again (docs/design.md §5.5). The
/// answer is final: 422 `response-not-stored`, or the failure's own store
/// problem if it could not be recorded either.
async fn end_refused(
    store: &AnyStore,
    lease: &Lease,
    refusal: &StoreError,
    retention: Duration,
) -> Problem {
    let failure = Failure::result_refused(refusal);
    let short = failure.cut_short();
    let recorded = match (store.fail(lease, failure, retention).await, short) {
        (Err(error), Some(short)) if error.is_refusal() => {
            store.fail(lease, short, retention).await
        }
        (recorded, _) => recorded,
    };
    match recorded {
        Ok(()) => Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            idem_http::problem_types::NOT_STORED,
            "result not stored",
            format!(
                "the store refused the result ({}); the claim was ended as a terminal failure \
                 with that reason, so the work will not run again under this key",
                idem::error_chain(refusal)
            ),
        ),
        Err(error) => store_problem(error),
    }
}

/// The API, shared by the routes.
pub(crate) type Shared = Arc<Api>;
