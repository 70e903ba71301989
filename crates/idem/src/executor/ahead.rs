//! Claims made ahead of their runs, in one round trip for many.

use std::error::Error as StdError;
use std::future::Future;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use super::{Context, Idempotency, Outcome, RunError};
use crate::codec::Codec;
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;
use crate::metrics as m;
use crate::record::{ClaimOutcome, ClaimParams};
use crate::store::{ClaimMany, Store, StoreError};

/// A claim made ahead of its run by [`Idempotency::claim_ahead`]: run it
/// with [`Idempotency::run_claimed`].
#[derive(Debug)]
pub struct ClaimedAhead {
    id: RecordId,
    params: ClaimParams,
    claim: Result<ClaimOutcome, StoreError>,
    sent: Instant,
}

impl ClaimedAhead {
    /// The record it claimed.
    pub fn id(&self) -> &RecordId {
        &self.id
    }
}

impl<S: ClaimMany, C: Codec> Idempotency<S, C> {
    /// Claims every run in one round trip (the store's `claim_many`), for
    /// runs that follow one another soon, such as the next records of a
    /// partition. Each answer is kept for [`run_claimed`](Self::run_claimed),
    /// which runs, replays or refuses exactly as [`run`](Self::run) would
    /// have. A claim older than a heartbeat interval is renewed before its
    /// handler starts; one that another worker took over meanwhile (its
    /// lease ran out first) is [`RunError::LeaseLost`] and its handler
    /// does not run. When the whole batch fails, every entry carries the
    /// error.
    pub async fn claim_ahead(
        &self,
        runs: Vec<(RecordId, Option<Fingerprint>)>,
    ) -> Vec<ClaimedAhead> {
        let claims: Vec<(RecordId, ClaimParams)> = runs
            .into_iter()
            .map(|(id, fingerprint)| {
                (
                    self.stored_id(&id).into_owned(),
                    self.claim_params(fingerprint),
                )
            })
            .collect();
        // Duplicates of runs completed here are answered from memory; the
        // rest are claimed in one round trip.
        let remembered: Vec<Option<Bytes>> = claims
            .iter()
            .map(|(id, params)| self.remembered(id, params))
            .collect();
        let asked: Vec<(RecordId, ClaimParams)> = claims
            .iter()
            .zip(&remembered)
            .filter(|(_, hit)| hit.is_none())
            .map(|(claim, _)| claim.clone())
            .collect();
        let sent = Instant::now();
        let mut answers = if asked.is_empty() {
            Vec::new()
        } else {
            match m::timed(m::OP_CLAIM, self.store.claim_many(&asked)).await {
                Ok(answers) if answers.len() == asked.len() => answers,
                Ok(answers) => {
                    let error = StoreError::Backend(
                        format!(
                            "claim_many answered {} claims of {}",
                            answers.len(),
                            asked.len()
                        )
                        .into(),
                    );
                    asked.iter().map(|_| Err(error.copy())).collect()
                }
                Err(error) => asked.iter().map(|_| Err(error.copy())).collect(),
            }
        }
        .into_iter();
        claims
            .into_iter()
            .zip(remembered)
            .map(|((id, params), hit)| {
                let claim = match hit {
                    Some(response) => Ok(ClaimOutcome::Completed(response)),
                    None => {
                        let claim = answers.next().unwrap_or_else(|| {
                            Err(StoreError::Backend("claim missing from batch".into()))
                        });
                        if let Ok(outcome) = &claim {
                            m::claim(outcome.label());
                        }
                        claim
                    }
                };
                ClaimedAhead {
                    id,
                    params,
                    claim,
                    sent,
                }
            })
            .collect()
    }
}

impl<S: Store, C: Codec> Idempotency<S, C> {
    /// [`run`](Self::run) for a claim made ahead by
    /// [`claim_ahead`](Self::claim_ahead): runs `handler` if the claim was
    /// acquired, and otherwise answers as `run` would (a replay, a stored
    /// failure, in progress, a mismatch, or the store's error; fail-open
    /// runs unguarded). It does not wait for an in-flight duplicate.
    pub async fn run_claimed<T, E, F, Fut>(
        &self,
        ahead: ClaimedAhead,
        handler: F,
    ) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: StdError + Send + Sync + 'static,
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let ClaimedAhead {
            id,
            params,
            claim,
            sent,
        } = ahead;
        self.instrumented(&id, async {
            match claim {
                Ok(ClaimOutcome::Acquired(lease)) => {
                    // A claim made a while ago is renewed before the
                    // handler starts: the renewal proves nobody took it
                    // over meanwhile, however long it waited.
                    let sent = if sent.elapsed() >= self.config.heartbeat {
                        let renewed = Instant::now();
                        match m::timed(m::OP_EXTEND, self.store.extend(&lease, params.lease)).await
                        {
                            Ok(_) => renewed,
                            Err(StoreError::LeaseLost) => {
                                m::count(m::LEASE_LOST, &[("at", "start")]);
                                return Err(RunError::LeaseLost);
                            }
                            Err(error) => return Err(RunError::Store(error)),
                        }
                    } else {
                        sent
                    };
                    self.execute(&lease, sent, params.fingerprint, handler)
                        .await
                }
                Ok(outcome) => self.replay(&id, outcome).await,
                Err(error @ StoreError::Unavailable(_))
                    if self.config.fail_open && !error.is_contention() =>
                {
                    tracing::warn!(
                        scope = %id.scope(),
                        key = %self.logged_key(&id),
                        %error,
                        "store unreachable; running unguarded (fail-open)"
                    );
                    m::count(m::FAIL_OPEN, &[]);
                    self.unguarded(&id, handler).await
                }
                Err(error) => Err(RunError::Store(error)),
            }
        })
        .await
    }
}
