//! The pure state machine (see [the contract](crate::contract)): given what a store holds for a
//! key, the request and the time, decide what the store must write and
//! answer. Stores only perform the decision atomically; every rule lives
//! here, so every local store applies the same rules, and networked stores
//! mirror them in their scripts (the conformance suite checks both).

use std::time::Duration;

use bytes::Bytes;

use crate::clock::Timestamp;
use crate::key::RecordId;
use crate::record::{
    ClaimOutcome, ClaimParams, Failure, FailureClass, Lease, LeaseToken, Record, Resolution,
    Resolved, State, StepBegin, StepState,
};

/// What a store supplies to a claim that might acquire: a token it has never
/// handed out before, and a floor for the fencing number (a store-wide
/// counter that survives the record, so fences stay monotonic per key even
/// after a record expires or is deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fresh {
    /// A never-used token.
    pub token: LeaseToken,
    /// The smallest fencing number this claim may get.
    pub fence_floor: u64,
}

/// The decision for a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Write `record` and answer [`ClaimOutcome::Acquired`].
    Acquire {
        /// The record to store.
        record: Record,
        /// Whether this takes over an expired lease.
        takeover: bool,
    },
    /// Change nothing; answer with this outcome.
    Answer(ClaimOutcome),
}

impl ClaimDecision {
    /// Splits the decision into what to write (if anything) and what to
    /// answer.
    pub fn into_parts(self, id: &RecordId) -> (Option<Record>, ClaimOutcome) {
        match self {
            ClaimDecision::Acquire { record, takeover } => {
                let State::InProgress { token, lease_until } = record.state else {
                    unreachable!("an acquired record is always in progress")
                };
                let lease = Lease {
                    id: id.clone(),
                    token,
                    fence: record.fence,
                    attempt: record.attempt,
                    takeover,
                    lease_until,
                };
                (Some(record), ClaimOutcome::Acquired(lease))
            }
            ClaimDecision::Answer(outcome) => (None, outcome),
        }
    }
}

/// Decides a claim on `existing` (what the store holds, expired or not).
pub fn decide_claim(
    existing: Option<&Record>,
    params: &ClaimParams,
    now: Timestamp,
    fresh: Fresh,
) -> ClaimDecision {
    let lease_until = now.saturating_add(params.lease);
    let retention = params.retention.max(params.lease);
    let fence = existing
        .map_or(0, |r| r.fence.saturating_add(1))
        .max(fresh.fence_floor);
    let live = existing.filter(|r| !r.is_expired(now));

    let Some(record) = live else {
        return ClaimDecision::Acquire {
            record: Record {
                state: State::InProgress {
                    token: fresh.token,
                    lease_until,
                },
                fingerprint: params.fingerprint,
                attempt: 1,
                fence,
                created_at: now,
                updated_at: now,
                expires_at: now.saturating_add(retention),
            },
            takeover: false,
        };
    };

    if record.fingerprint != params.fingerprint {
        return ClaimDecision::Answer(ClaimOutcome::Mismatch);
    }

    let takeover = match &record.state {
        State::Completed { response } => {
            return ClaimDecision::Answer(ClaimOutcome::Completed(response.clone()))
        }
        State::Failed { failure } => {
            return ClaimDecision::Answer(ClaimOutcome::Failed(failure.clone()))
        }
        State::InProgress {
            lease_until: current,
            ..
        } if now < *current => {
            return ClaimDecision::Answer(ClaimOutcome::InProgress {
                retry_after: current.since(now),
            })
        }
        State::InProgress { .. } => true,
        State::Released { .. } => false,
    };

    ClaimDecision::Acquire {
        record: Record {
            state: State::InProgress {
                token: fresh.token,
                lease_until,
            },
            fingerprint: record.fingerprint,
            attempt: record.attempt.saturating_add(1),
            fence,
            created_at: record.created_at,
            updated_at: now,
            expires_at: record.expires_at.max(now.saturating_add(retention)),
        },
        takeover,
    }
}

/// A write by a lease holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Store the response; keep it for `retention`.
    Complete {
        /// The encoded response.
        response: Bytes,
        /// How long to keep it.
        retention: Duration,
    },
    /// Record a failure: retryable ones release the record, terminal and
    /// unknown ones are kept and replayed for `retention`.
    Fail {
        /// What failed.
        failure: Failure,
        /// How long to keep the record.
        retention: Duration,
    },
    /// Heartbeat: the lease now runs until `now + lease`.
    Extend {
        /// The new lease length from now.
        lease: Duration,
    },
    /// Give the claim back.
    Release,
}

/// The holder's token is no longer on the record: it was taken over,
/// released, deleted, or the record expired. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("lease lost: the record no longer carries this lease's token")]
pub struct LeaseLost;

/// Decides a write by the holder of `token`: the new record, or
/// [`LeaseLost`] if the record (as seen at `now`) does not carry `token`.
pub fn decide_write(
    existing: Option<&Record>,
    token: LeaseToken,
    write: Write,
    now: Timestamp,
) -> Result<Record, LeaseLost> {
    let record = held(existing, token, now)?;
    let State::InProgress { lease_until, .. } = record.state else {
        return Err(LeaseLost);
    };
    let mut next = record.clone();
    next.updated_at = now;
    match write {
        Write::Complete {
            response,
            retention,
        } => {
            next.state = State::Completed { response };
            next.expires_at = now.saturating_add(retention);
        }
        Write::Fail { failure, retention } => {
            next.expires_at = now.saturating_add(retention);
            next.state = match failure.class {
                FailureClass::Retryable => State::Released {
                    last_failure: Some(failure),
                },
                FailureClass::Terminal | FailureClass::Unknown => State::Failed { failure },
            };
        }
        Write::Extend { lease } => {
            let until = now.saturating_add(lease).max(lease_until);
            next.state = State::InProgress {
                token,
                lease_until: until,
            };
            next.expires_at = next.expires_at.max(until);
        }
        Write::Release => {
            next.state = State::Released { last_failure: None };
        }
    }
    Ok(next)
}

/// The record if it is live and in progress under `token` at `now`: what
/// every holder's write (and every step journal write) checks first.
pub fn held(
    existing: Option<&Record>,
    token: LeaseToken,
    now: Timestamp,
) -> Result<&Record, LeaseLost> {
    let record = existing.filter(|r| !r.is_expired(now)).ok_or(LeaseLost)?;
    match record.state {
        State::InProgress { token: held, .. } if held == token => Ok(record),
        _ => Err(LeaseLost),
    }
}

/// Decides the start of a journaled step by the holder of attempt
/// `attempt` (after [`held`] passed): what to write for the step, if
/// anything, and the answer.
pub fn decide_step_begin(
    existing: Option<&StepState>,
    attempt: u32,
) -> (Option<StepState>, StepBegin) {
    let started = Some(StepState::Started { attempt });
    match existing {
        None => (started, StepBegin::Fresh),
        Some(StepState::Started { attempt: earlier }) => (started, step_begun(*earlier, attempt)),
        Some(StepState::Done { result }) => (None, StepBegin::Done(result.clone())),
    }
}

/// What a step's unfinished mark made by attempt `earlier` means to the
/// holder of attempt `attempt`: another attempt's mark is a step in doubt;
/// the same attempt's mark is its own earlier `begin_step`, whose answer
/// was lost and which it is retrying, and since the work runs only after
/// that answer, the step has not run (docs/design.md §7): it is fresh.
pub fn step_begun(earlier: u32, attempt: u32) -> StepBegin {
    if earlier == attempt {
        StepBegin::Fresh
    } else {
        StepBegin::InDoubt { attempt: earlier }
    }
}

/// What a journal's entry for a step means to the holder of attempt
/// `attempt`: its `result` if it is done, else [`step_begun`] of the
/// attempt that marked it `earlier`, else (no entry) a fresh step.
pub fn step_found(result: Option<Bytes>, earlier: Option<u32>, attempt: u32) -> StepBegin {
    match (result, earlier) {
        (Some(result), _) => StepBegin::Done(result),
        (None, Some(earlier)) => step_begun(earlier, attempt),
        (None, None) => StepBegin::Fresh,
    }
}

/// Decides an operator's resolution of a parked record's step in doubt:
/// the released record and the step's new state (`None`: remove it), or
/// why nothing changes.
pub fn decide_resolve(
    existing: Option<&Record>,
    step: Option<&StepState>,
    resolution: Resolution,
    now: Timestamp,
) -> Result<(Record, Option<StepState>), Resolved> {
    let record = existing
        .filter(|r| !r.is_expired(now))
        .ok_or(Resolved::NotParked)?;
    match &record.state {
        State::Failed { failure } if failure.is_parked() => {}
        _ => return Err(Resolved::NotParked),
    }
    if !matches!(step, Some(StepState::Started { .. })) {
        return Err(Resolved::StepNotInDoubt);
    }
    let mut next = record.clone();
    next.state = State::Released { last_failure: None };
    next.updated_at = now;
    let step = match resolution {
        Resolution::Applied(result) => Some(StepState::Done { result }),
        Resolution::NotApplied => None,
    };
    Ok((next, step))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprint;

    const LEASE: Duration = Duration::from_secs(10);
    const KEEP: Duration = Duration::from_secs(100);

    fn fresh(n: u64) -> Fresh {
        Fresh {
            token: LeaseToken::from_parts(7, n),
            fence_floor: n,
        }
    }

    fn at(s: u64) -> Timestamp {
        Timestamp::from_millis(s * 1000)
    }

    fn acquire(existing: Option<&Record>, now: Timestamp, n: u64) -> (Record, bool) {
        match decide_claim(existing, &ClaimParams::new(LEASE, KEEP), now, fresh(n)) {
            ClaimDecision::Acquire { record, takeover } => (record, takeover),
            other => panic!("expected acquire, got {other:?}"),
        }
    }

    #[test]
    fn absent_is_acquired_and_live_lease_is_busy() {
        let (r, takeover) = acquire(None, at(0), 1);
        assert!(!takeover);
        assert_eq!(r.attempt, 1);
        assert_eq!(r.expires_at, at(100));
        let busy = decide_claim(Some(&r), &ClaimParams::new(LEASE, KEEP), at(4), fresh(2));
        assert_eq!(
            busy,
            ClaimDecision::Answer(ClaimOutcome::InProgress {
                retry_after: Duration::from_secs(6)
            })
        );
    }

    #[test]
    fn expired_lease_is_a_takeover_with_a_new_token() {
        let (r, _) = acquire(None, at(0), 1);
        let (t, takeover) = acquire(Some(&r), at(10), 2);
        assert!(takeover);
        assert_eq!(t.attempt, 2);
        assert!(t.fence > r.fence);
        let old = LeaseToken::from_parts(7, 1);
        let write = Write::Release;
        assert_eq!(decide_write(Some(&t), old, write, at(11)), Err(LeaseLost));
    }

    #[test]
    fn expired_record_is_absent_but_fence_keeps_rising() {
        let (r, _) = acquire(None, at(0), 5);
        let done = decide_write(
            Some(&r),
            LeaseToken::from_parts(7, 5),
            Write::Complete {
                response: Bytes::from_static(b"ok"),
                retention: Duration::from_secs(1),
            },
            at(1),
        )
        .expect("holder writes");
        let (again, takeover) = acquire(Some(&done), at(2), 0);
        assert!(!takeover);
        assert_eq!(again.attempt, 1);
        assert_eq!(again.fence, 6, "fence continues from the expired record");
    }

    #[test]
    fn mismatch_wins_over_every_live_state() {
        let fp = ClaimParams::new(LEASE, KEEP).fingerprint(Fingerprint::of_bytes(b"a"));
        let (r, _) = decide_claim(None, &fp, at(0), fresh(1))
            .into_parts(&RecordId::parse("s", "k").expect("valid"));
        let r = r.expect("acquired");
        let other = ClaimParams::new(LEASE, KEEP).fingerprint(Fingerprint::of_bytes(b"b"));
        assert_eq!(
            decide_claim(Some(&r), &other, at(1), fresh(2)),
            ClaimDecision::Answer(ClaimOutcome::Mismatch)
        );
        assert_eq!(
            decide_claim(Some(&r), &ClaimParams::new(LEASE, KEEP), at(1), fresh(2)),
            ClaimDecision::Answer(ClaimOutcome::Mismatch),
            "no fingerprint against a bound one is a mismatch too"
        );
    }

    #[test]
    fn retryable_failure_releases_terminal_is_kept() {
        let (r, _) = acquire(None, at(0), 1);
        let tok = LeaseToken::from_parts(7, 1);
        let retry = decide_write(
            Some(&r),
            tok,
            Write::Fail {
                failure: Failure::new(FailureClass::Retryable, "busy"),
                retention: KEEP,
            },
            at(1),
        )
        .expect("written");
        assert!(matches!(
            retry.state,
            State::Released {
                last_failure: Some(_)
            }
        ));
        let term = decide_write(
            Some(&r),
            tok,
            Write::Fail {
                failure: Failure::new(FailureClass::Terminal, "bad"),
                retention: KEEP,
            },
            at(1),
        )
        .expect("written");
        let answer = decide_claim(Some(&term), &ClaimParams::new(LEASE, KEEP), at(2), fresh(2));
        assert_eq!(
            answer,
            ClaimDecision::Answer(ClaimOutcome::Failed(Failure::new(
                FailureClass::Terminal,
                "bad"
            )))
        );
    }

    #[test]
    fn extend_never_shortens_and_keeps_retention_past_the_lease() {
        let (r, _) = acquire(None, at(0), 1);
        let tok = LeaseToken::from_parts(7, 1);
        let e = decide_write(
            Some(&r),
            tok,
            Write::Extend {
                lease: Duration::from_secs(1),
            },
            at(1),
        )
        .expect("holder extends");
        assert_eq!(
            e.state,
            State::InProgress {
                token: tok,
                lease_until: at(10)
            }
        );
        let e = decide_write(
            Some(&e),
            tok,
            Write::Extend {
                lease: Duration::from_secs(500),
            },
            at(2),
        )
        .expect("holder extends");
        assert_eq!(e.expires_at, at(502));
    }
}
