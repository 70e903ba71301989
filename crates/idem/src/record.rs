//! The record kept per `(scope, key)`, the lease a claimer holds, and the
//! outcomes of a claim.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;

/// An opaque lease token. A store never hands out the same token twice in
/// its life, so a holder whose lease was taken over (or whose record expired
/// and was claimed again) can never write to the new holder's record.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseToken([u64; 2]);

impl LeaseToken {
    /// Builds a token from its raw value.
    pub const fn from_u128(raw: u128) -> Self {
        Self([(raw >> 64) as u64, raw as u64])
    }

    /// Builds a token from a store instance id and a sequence number: unique
    /// as long as `instance` is unique per store life and `seq` never repeats
    /// within it.
    pub const fn from_parts(instance: u64, seq: u64) -> Self {
        Self([instance, seq])
    }

    /// The raw value.
    pub const fn as_u128(self) -> u128 {
        ((self.0[0] as u128) << 64) | self.0[1] as u128
    }

    /// The 32-character lowercase hex form.
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.as_u128())
    }

    /// Parses the hex form.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(Self::from_u128)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.to_hex())
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// Mints lease tokens for a store whose tokens are made by the client: a
/// random non-zero instance id drawn once per mint, and a counter. Tokens
/// from one mint never repeat; tokens from two mints differ unless their
/// random ids collide (one chance in 2^64).
#[derive(Debug)]
pub struct TokenMint {
    instance: u64,
    seq: AtomicU64,
}

impl TokenMint {
    /// A mint with a fresh random instance id.
    pub fn new() -> Self {
        let instance = loop {
            let n = rand::random::<u64>();
            if n != 0 {
                break n;
            }
        };
        Self {
            instance,
            seq: AtomicU64::new(1),
        }
    }

    /// A token this mint has never handed out.
    pub fn next(&self) -> LeaseToken {
        LeaseToken::from_parts(self.instance, self.seq.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for TokenMint {
    fn default() -> Self {
        Self::new()
    }
}

/// How a failure is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// Worth trying again: the claim is released and may be claimed anew.
    Retryable,
    /// Will fail the same way every time: stored and replayed.
    Terminal,
    /// The outcome of an effect is not known (in doubt); stored and replayed
    /// until someone reconciles it.
    Unknown,
}

impl FailureClass {
    /// A stable lowercase name, for storage and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureClass::Retryable => "retryable",
            FailureClass::Terminal => "terminal",
            FailureClass::Unknown => "unknown",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "retryable" => Some(Self::Retryable),
            "terminal" => Some(Self::Terminal),
            "unknown" => Some(Self::Unknown),
            _ => None,
        }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A recorded failure: its class and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// How the failure was classified.
    pub class: FailureClass,
    /// What went wrong, as the handler's error displayed it.
    pub message: String,
}

/// Failure messages are cut to this many bytes when the store refuses the
/// whole message.
const SHORT_FAILURE: usize = 256;

impl Failure {
    /// A failure of the given class.
    pub fn new(class: FailureClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
        }
    }

    /// The terminal failure that ends a run whose result the store
    /// refused ([`StoreError::is_refusal`](crate::StoreError::is_refusal)):
    /// the work ran, so the record must not stay claimed to be taken over
    /// and run again (docs/design.md §5.5).
    pub fn result_refused(refusal: &crate::StoreError) -> Self {
        Self::new(
            FailureClass::Terminal,
            format!(
                "the handler ran, but the store refused its response: {}",
                crate::error_chain(refusal)
            ),
        )
    }

    /// This failure with its message cut to 256 bytes (at a character
    /// boundary, marked as cut), for a store that refused the whole
    /// message; `None` if it is that short already.
    pub fn cut_short(&self) -> Option<Self> {
        const MARK: &str = " [cut short]";
        if self.message.len() <= SHORT_FAILURE - MARK.len() {
            return None;
        }
        let mut end = SHORT_FAILURE - MARK.len();
        while !self.message.is_char_boundary(end) {
            end -= 1;
        }
        Some(Self::new(
            self.class,
            format!("{}{MARK}", &self.message[..end]),
        ))
    }
}

/// The state of a record (see [the contract](crate::contract)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Claimed; the holder of `token` may write until someone takes over
    /// after `lease_until`.
    InProgress {
        /// The holder's token.
        token: LeaseToken,
        /// When the lease runs out and a takeover becomes possible.
        lease_until: Timestamp,
    },
    /// Done; the stored response is replayed to every later claim.
    Completed {
        /// The stored response, as the executor encoded it.
        response: Bytes,
    },
    /// Failed for good (terminal or unknown); replayed to later claims.
    Failed {
        /// What was recorded.
        failure: Failure,
    },
    /// Given back (released, or failed retryably); the next claim acquires
    /// it with the attempt count carried on.
    Released {
        /// The retryable failure that released it, if any.
        last_failure: Option<Failure>,
    },
}

/// The name of a [`State`], for filtering lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateKind {
    /// [`State::InProgress`].
    InProgress,
    /// [`State::Completed`].
    Completed,
    /// [`State::Failed`].
    Failed,
    /// [`State::Released`].
    Released,
}

impl StateKind {
    /// A stable lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            StateKind::InProgress => "in_progress",
            StateKind::Completed => "completed",
            StateKind::Failed => "failed",
            StateKind::Released => "released",
        }
    }
}

impl State {
    /// This state's kind.
    pub fn kind(&self) -> StateKind {
        match self {
            State::InProgress { .. } => StateKind::InProgress,
            State::Completed { .. } => StateKind::Completed,
            State::Failed { .. } => StateKind::Failed,
            State::Released { .. } => StateKind::Released,
        }
    }

    /// Whether this is a completion with exactly `response`.
    pub fn completed_with(&self, response: &[u8]) -> bool {
        matches!(self, State::Completed { response: stored } if stored == response)
    }
}

/// Everything a store keeps for one `(scope, key)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Where the record is in its life.
    pub state: State,
    /// The fingerprint bound to the key by its first claim, if any.
    pub fingerprint: Option<Fingerprint>,
    /// How many times the record has been acquired (1 for the first claim).
    pub attempt: u32,
    /// The fencing number of the latest claim; strictly increasing per key.
    pub fence: u64,
    /// When the record was first claimed.
    pub created_at: Timestamp,
    /// When the record last changed.
    pub updated_at: Timestamp,
    /// The retention deadline: from this instant on the record is absent.
    pub expires_at: Timestamp,
}

impl Record {
    /// Whether the record has passed its retention deadline at `now`. An
    /// expired record behaves as absent, whether or not it was purged.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// Whether the record is abandoned at `now`: live, in progress, and its
    /// lease has run out, so the next claim takes it over. This is what
    /// [`FindAbandoned`](crate::FindAbandoned) finds.
    pub fn is_abandoned(&self, now: Timestamp) -> bool {
        !self.is_expired(now)
            && matches!(self.state, State::InProgress { lease_until, .. } if now >= lease_until)
    }
}

/// What a claim asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimParams {
    /// The request's fingerprint; a live record with a different one is a
    /// [`ClaimOutcome::Mismatch`].
    pub fingerprint: Option<Fingerprint>,
    /// How long the lease lasts before another claimer may take over.
    pub lease: Duration,
    /// How long the record is kept if its holder vanishes (the retention of
    /// an in-progress or released record). Never shorter than `lease`.
    pub retention: Duration,
}

impl ClaimParams {
    /// A claim with a lease and retention and no fingerprint.
    pub fn new(lease: Duration, retention: Duration) -> Self {
        Self {
            fingerprint: None,
            lease,
            retention,
        }
    }

    /// The same claim with a fingerprint.
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }
}

/// A claim held on a record. Every write (`complete`, `fail`, `extend`,
/// `release`) is accepted only while the record still carries this lease's
/// token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The record claimed.
    pub id: RecordId,
    /// The token that proves ownership.
    pub token: LeaseToken,
    /// A per-key monotonic fencing number: each claim of the key gets a
    /// larger one, so downstream systems can reject writes from an older
    /// holder.
    pub fence: u64,
    /// Which attempt this is (1 for the first claim).
    pub attempt: u32,
    /// Whether this claim took over an expired lease: an earlier attempt may
    /// have partly run.
    pub takeover: bool,
    /// When this lease runs out unless extended.
    pub lease_until: Timestamp,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller holds the record and should run the work.
    Acquired(Lease),
    /// Someone else holds a live lease; ask again after `retry_after`.
    InProgress {
        /// Time until the current lease runs out.
        retry_after: Duration,
    },
    /// The work was done; here is the stored response.
    Completed(Bytes),
    /// The work failed for good; here is the stored failure.
    Failed(Failure),
    /// The key is bound to a different fingerprint.
    Mismatch,
    /// The key's record ended (completed or failed) with this claim's
    /// fingerprint and expired at `expired_at`, within the store's memory
    /// of expired keys ([`crate::horizon`]): a retry that came too late to
    /// be replayed, refused rather than run again. Nothing was written.
    Forgotten {
        /// When the record expired (the start of that day, once the record
        /// itself is gone).
        expired_at: Timestamp,
    },
}

impl ClaimOutcome {
    /// A short stable label, for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ClaimOutcome::Acquired(l) if l.takeover => "takeover",
            ClaimOutcome::Acquired(_) => "acquired",
            ClaimOutcome::InProgress { .. } => "in_progress",
            ClaimOutcome::Completed(_) => "completed",
            ClaimOutcome::Failed(_) => "failed",
            ClaimOutcome::Mismatch => "mismatch",
            ClaimOutcome::Forgotten { .. } => "forgotten",
        }
    }
}

/// Where one journaled step of a record stands (see
/// [`Context::step`](crate::Context::step)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepState {
    /// Marked started by `attempt` before its work ran, and not finished:
    /// if that attempt is gone, the step's outcome is unknown (in doubt).
    Started {
        /// The attempt that started it.
        attempt: u32,
    },
    /// Finished; `result` is replayed to every later attempt instead of
    /// running the step again. An empty `result` means the step was
    /// skipped in doubt (its policy was at-most-once).
    Done {
        /// The step's result as JSON, or empty if it was skipped.
        result: Bytes,
    },
}

/// One entry of a record's step journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepEntry {
    /// The step's name, unique within its record.
    pub name: String,
    /// Where it stands.
    pub state: StepState,
}

/// What [`StepJournal::begin_step`](crate::StepJournal::begin_step) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepBegin {
    /// The step never started for this record: it is now marked started
    /// by this lease's attempt, and its work may run.
    Fresh,
    /// An earlier attempt marked the step started and never finished it:
    /// its outcome is unknown. (A mark of this lease's own attempt is its
    /// own `begin_step` retried after a lost answer: that is `Fresh`.) The step is now marked started by this
    /// lease's attempt; the step's policy decides what happens.
    InDoubt {
        /// The attempt that left it started.
        attempt: u32,
    },
    /// The step finished on an earlier attempt; this is its journaled
    /// result (empty if it was skipped). Nothing was written.
    Done(Bytes),
}

/// An operator's finding about a parked record's step in doubt, for
/// [`StepJournal::resolve_step`](crate::StepJournal::resolve_step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The effect happened (checked in the external system); `result` is
    /// journaled as the step's result (JSON of the step's output type),
    /// so the next attempt skips the step and goes on.
    Applied(Bytes),
    /// The effect did not happen; the step's mark is removed, so the next
    /// attempt runs it.
    NotApplied,
}

impl Resolution {
    /// Whether the effect happened, and the result to journal (empty when
    /// it did not), as stores write them.
    pub fn into_parts(self) -> (bool, Bytes) {
        match self {
            Resolution::Applied(result) => (true, result),
            Resolution::NotApplied => (false, Bytes::new()),
        }
    }
}

/// What [`StepJournal::resolve_step`](crate::StepJournal::resolve_step)
/// did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// The step was resolved and the record released: the next claim
    /// acquires it and resumes after the journaled steps.
    Released,
    /// The record is absent, or not parked (not failed with an unknown
    /// outcome, see [`Failure::is_parked`]). Nothing changed.
    NotParked,
    /// The record is parked but the named step is not in doubt (absent or
    /// already finished). Nothing changed.
    StepNotInDoubt,
}

impl Failure {
    /// Whether this failure parks its record for reconciliation: its
    /// outcome is unknown (a step in doubt under the
    /// [`Park`](crate::step::Park) policy, or a handler error classified
    /// [`FailureClass::Unknown`]). Parked records are replayed as failed
    /// until an operator resolves them.
    pub fn is_parked(&self) -> bool {
        self.class == FailureClass::Unknown
    }
}

/// What a transactional inbox's claim found (the inboxes of
/// `idem-sqlite` and `idem-postgres`, inside the caller's transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxOutcome {
    /// First time: do the work in this transaction and commit it.
    New,
    /// Already done (committed) by an earlier delivery; `response` is what
    /// it recorded as its response, if anything.
    Duplicate {
        /// The recorded response.
        response: Option<Vec<u8>>,
    },
    /// The key was used with a different fingerprint.
    Mismatch,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_hex() {
        let t = LeaseToken::from_parts(0xdead_beef, 42);
        assert_eq!(LeaseToken::from_hex(&t.to_hex()), Some(t));
        assert_eq!(LeaseToken::from_hex("abc"), None);
        assert_ne!(LeaseToken::from_parts(1, 2), LeaseToken::from_parts(2, 1));
        assert_eq!(LeaseToken::from_u128(t.as_u128()), t);
        assert!(LeaseToken::from_parts(1, 0) > LeaseToken::from_parts(0, u64::MAX));
    }

    #[test]
    fn a_mint_never_repeats_and_two_mints_differ() {
        let (a, b) = (TokenMint::new(), TokenMint::new());
        let first = a.next();
        assert_ne!(first, a.next());
        assert_ne!(first, b.next());
    }

    #[test]
    fn failure_classes_round_trip() {
        for c in [
            FailureClass::Retryable,
            FailureClass::Terminal,
            FailureClass::Unknown,
        ] {
            assert_eq!(FailureClass::parse(c.as_str()), Some(c));
        }
        assert_eq!(FailureClass::parse("nope"), None);
    }
}
