//! Metric names recorded through the [`metrics`](https://docs.rs/metrics)
//! facade. Install any recorder (e.g. a Prometheus exporter) to collect
//! them; with none installed they cost next to nothing.
//!
#![doc = include_str!("../docs/metrics.md")]
//!
//! The duplicate rate, as a share of the runs that finished, is
//! `idem_replays_total / (idem_replays_total + idem_executions_total)`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tracing::Instrument as _;

/// Claims by outcome.
pub const CLAIMS: &str = "idem_claims_total";
/// Duplicates answered with a stored outcome.
pub const REPLAYS: &str = "idem_replays_total";
/// Claims that took over an expired lease.
pub const TAKEOVERS: &str = "idem_takeovers_total";
/// Leases lost while or after the handler ran.
pub const LEASE_LOST: &str = "idem_lease_lost_total";
/// Claims refused for a different fingerprint.
pub const MISMATCHES: &str = "idem_mismatches_total";
/// Late retries refused: their key's record had expired (remembered by
/// the store, or a UUIDv7 key older than the retention).
pub const FORGOTTEN: &str = "idem_forgotten_total";
/// Handler runs by result.
pub const EXECUTIONS: &str = "idem_executions_total";
/// Handler runs without protection because the store was down (fail-open).
pub const FAIL_OPEN: &str = "idem_fail_open_total";
/// Store operations that returned an error other than a lost lease.
pub const STORE_ERRORS: &str = "idem_store_errors_total";
/// Store operation latency in seconds.
pub const STORE_SECONDS: &str = "idem_store_seconds";

/// Journaled steps by result: run now, or replayed from the journal.
pub const STEPS: &str = "idem_steps_total";
/// Steps found started but unfinished by a later attempt, by policy.
pub const STEPS_IN_DOUBT: &str = "idem_steps_in_doubt_total";
/// Runs that parked their record for reconciliation.
pub const PARKED: &str = "idem_parked_total";

/// Records the completer re-drove, by `result` (`completed`, `failed`,
/// `parked`, `released`, `skipped`, `error`).
pub const REDRIVEN: &str = "idem_completer_redriven_total";
/// Blobs removed by the sweep because no record names them.
pub const BLOBS_SWEPT: &str = "idem_blobs_swept_total";
/// Replays whose record names a blob that is missing or corrupt.
pub const BLOBS_UNREADABLE: &str = "idem_blobs_unreadable_total";
/// Outbox messages a broker confirmed.
pub const OUTBOX_SENT: &str = "idem_outbox_sent_total";
/// Outbox messages left pending after a failed send, by `by` (`run`,
/// `replay`, `dispatcher`) and `error` (`unavailable`, `refused`).
pub const OUTBOX_FAILED: &str = "idem_outbox_send_failures_total";
/// Runs' messages dispatched in full, by `by` (`run`, `replay`,
/// `dispatcher`, `unguarded`).
pub const OUTBOX_DISPATCHES: &str = "idem_outbox_dispatches_total";
/// Runs the dispatcher found pending on its last pass (their messages not
/// confirmed sent, their holder gone: markers, or runs the store's
/// pending index marked): the outbox's backlog.
pub const OUTBOX_PENDING: &str = "idem_outbox_pending";
/// Seconds from a message's making (the time in its UUIDv7 id) to its
/// broker's confirmation: the outbox's lag.
pub const OUTBOX_LAG: &str = "idem_outbox_lag_seconds";
pub(crate) const OP_CLAIM: &str = "claim";
pub(crate) const OP_COMPLETE: &str = "complete";
pub(crate) const OP_FAIL: &str = "fail";
pub(crate) const OP_EXTEND: &str = "extend";
pub(crate) const OP_RELEASE: &str = "release";
pub(crate) const OP_CONFIRM: &str = "confirm_sent";
pub(crate) const OP_STEP_BEGIN: &str = "step_begin";
pub(crate) const OP_STEP_FINISH: &str = "step_finish";

/// Where the metrics counted through [`add`] and [`timed`] say they come
/// from.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The `&'static metrics::Key` of a metric whose name and label are
/// constants: built, and its hash worked out, when compiling, so that
/// counting it on a run's path neither allocates nor hashes (as
/// `metrics::counter!` with labels does on every call).
macro_rules! key {
    ($name:expr) => {{
        static KEY: ::metrics::Key = ::metrics::Key::from_static_name($name);
        &KEY
    }};
    ($name:expr, $label:literal => $value:expr) => {{
        static LABELS: [::metrics::Label; 1] =
            [::metrics::Label::from_static_parts($label, $value)];
        static KEY: ::metrics::Key = ::metrics::Key::from_static_parts($name, &LABELS);
        &KEY
    }};
}
pub(crate) use key;

/// Adds one to the counter `key` (see [`key!`]).
pub(crate) fn add(key: &'static metrics::Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(1);
}

/// Counts a claim under its outcome's label
/// ([`ClaimOutcome::label`](crate::store::ClaimOutcome::label)).
pub(crate) fn claim(outcome: &'static str) {
    add(match outcome {
        "acquired" => key!(CLAIMS, "outcome" => "acquired"),
        "takeover" => key!(CLAIMS, "outcome" => "takeover"),
        "in_progress" => key!(CLAIMS, "outcome" => "in_progress"),
        "completed" => key!(CLAIMS, "outcome" => "completed"),
        "failed" => key!(CLAIMS, "outcome" => "failed"),
        "mismatch" => key!(CLAIMS, "outcome" => "mismatch"),
        other => return count(CLAIMS, &[("outcome", other)]),
    });
}

/// Counts `name` with `labels`, for the paths off a run's usual way (see
/// [`add`] for the others).
pub(crate) fn count(name: &'static str, labels: &[(&'static str, &'static str)]) {
    let labels: Vec<metrics::Label> = labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, *v))
        .collect();
    metrics::counter!(name, labels).increment(1);
}

/// Counts a confirmed outbox message, and its lag when its id is a
/// UUIDv7.
pub(crate) fn outbox_sent(id: &str) {
    add(key!(OUTBOX_SENT));
    if let Ok(crate::derive::KeyAge::Fresh { age }) = crate::derive::uuid_v7_age(
        id,
        crate::Timestamp::now(),
        std::time::Duration::MAX,
        std::time::Duration::from_secs(5),
    ) {
        metrics::histogram!(OUTBOX_LAG).record(age.as_secs_f64());
    }
}

/// Times a store operation and counts its errors (a lost lease is an
/// answer, not an error of the store). It runs in an `idem.store` span
/// (DEBUG: a span for each round trip is for when they are looked at)
/// that names the operation and, on failure, the error.
///
/// A future of its own rather than an `async fn`: an `async fn` keeps its
/// argument beside the future it awaits, so every run's future carried
/// each store operation twice (8.7 KiB for a completion through the
/// binaries' store of any kind), copied whole wherever the run's future
/// moved.
pub(crate) fn timed<T, F>(op: &'static str, fut: F) -> Timed<F>
where
    F: Future<Output = Result<T, crate::StoreError>>,
{
    let span = tracing::debug_span!("idem.store", op, error = tracing::field::Empty);
    Timed {
        inner: fut.instrument(span),
        op,
        start: Instant::now(),
    }
}

pin_project_lite::pin_project! {
    /// A store operation under [`timed`].
    pub(crate) struct Timed<F> {
        #[pin]
        inner: tracing::instrument::Instrumented<F>,
        op: &'static str,
        start: Instant,
    }
}

impl<T, F> Future for Timed<F>
where
    F: Future<Output = Result<T, crate::StoreError>>,
{
    type Output = Result<T, crate::StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let result = std::task::ready!(this.inner.as_mut().poll(cx));
        if let Err(error) = &result {
            this.inner
                .span()
                .record("error", tracing::field::display(error));
        }
        let op = *this.op;
        let seconds = match op {
            OP_CLAIM => key!(STORE_SECONDS, "op" => OP_CLAIM),
            OP_COMPLETE => key!(STORE_SECONDS, "op" => OP_COMPLETE),
            OP_FAIL => key!(STORE_SECONDS, "op" => OP_FAIL),
            OP_EXTEND => key!(STORE_SECONDS, "op" => OP_EXTEND),
            other => {
                metrics::histogram!(STORE_SECONDS, "op" => other)
                    .record(this.start.elapsed().as_secs_f64());
                return Poll::Ready(errors(other, result));
            }
        };
        metrics::with_recorder(|r| r.register_histogram(seconds, &METADATA))
            .record(this.start.elapsed().as_secs_f64());
        Poll::Ready(errors(op, result))
    }
}

/// Counts `result` under the store's errors of `op` if it is one.
fn errors<T>(
    op: &'static str,
    result: Result<T, crate::StoreError>,
) -> Result<T, crate::StoreError> {
    if let Err(e) = &result {
        if !matches!(e, crate::StoreError::LeaseLost) {
            metrics::counter!(STORE_ERRORS, "op" => op).increment(1);
        }
    }
    result
}
