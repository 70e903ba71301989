//! What callers ask the writer ([`Op`]), with where to answer ([`Job`]),
//! and what it answers ([`Done`]).

use bytes::Bytes;
use idem::machine::Write;
use idem::store::{ClaimOutcome, ClaimParams, Completion, Lease, StepBegin};
use idem::{RecordId, Resolution, Resolved, StoreError, Timestamp};
use tokio::sync::oneshot;

/// What a job asks the writer to do.
pub(crate) enum Op {
    /// One or more claims, answered in order.
    Claim(Vec<(RecordId, ClaimParams)>),
    /// A write by a lease holder.
    Write { lease: Lease, write: Write },
    /// Completions, each under its own lease's token check, answered in
    /// order.
    Complete(Vec<Completion>),
    /// Delete a record whatever its state.
    Delete(RecordId),
    /// Delete at most this many expired records.
    Purge(usize),
    /// Mark a step started, under the lease's token check.
    BeginStep { lease: Lease, step: String },
    /// Journal a step's result, under the lease's token check.
    FinishStep {
        lease: Lease,
        step: String,
        result: Bytes,
    },
    /// Resolve a parked record's step in doubt.
    Resolve {
        id: RecordId,
        step: String,
        resolution: Resolution,
    },
}

/// The writer's answer to a job.
pub(crate) enum Done {
    Claims(Vec<Result<ClaimOutcome, StoreError>>),
    Write(Result<Timestamp, StoreError>),
    Completes(Vec<Result<(), StoreError>>),
    Delete(bool),
    Purge(usize),
    BeginStep(Result<StepBegin, StoreError>),
    FinishStep(Result<(), StoreError>),
    Resolve(Result<Resolved, StoreError>),
}

/// A job as queued: what to do, and where its answer goes.
pub(crate) struct Job {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<Done, StoreError>>,
}
