//! The invocation's deadline, and a handler cut short before it.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lambda_runtime::Context;
use tokio::time::Instant;

/// How long before the invocation's deadline the batch handlers stop a
/// run, so that releasing its claim and answering Lambda fit in.
pub const DEFAULT_MARGIN: Duration = Duration::from_millis(500);

/// Why a run did not produce an outcome: the handler's own error, or the
/// invocation ran out of time. The handler's error stays in the
/// [`source`](std::error::Error::source) chain, so a
/// [`Terminal`](idem::Terminal) inside it is still terminal.
#[derive(Debug, thiserror::Error)]
pub enum Interrupted<E> {
    /// The handler failed.
    #[error("{0}")]
    Handler(#[source] E),
    /// The handler had not finished `margin` before the invocation's
    /// deadline: it was stopped and its claim released, for Lambda to
    /// deliver the record again.
    #[error("ran out of time: stopped {margin:?} before the invocation's deadline")]
    OutOfTime {
        /// How long before the deadline.
        margin: Duration,
    },
}

/// When the runs of an invocation must stop: its deadline less the margin.
pub(crate) fn stop_at(context: &Context, margin: Duration) -> Instant {
    let deadline = UNIX_EPOCH + Duration::from_millis(context.deadline);
    let left = deadline
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    Instant::now() + left.saturating_sub(margin)
}

/// Runs `work` until `stop`, when it is dropped and the run fails with
/// [`Interrupted::OutOfTime`].
pub(crate) async fn within<T, E>(
    stop: Instant,
    margin: Duration,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, Interrupted<E>> {
    tokio::select! {
        biased;
        result = work => result.map_err(Interrupted::Handler),
        () = tokio::time::sleep_until(stop) => Err(Interrupted::OutOfTime { margin }),
    }
}
