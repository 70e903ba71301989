//! A run that the request's own future drives, handed to a task of its own
//! only if that future is dropped first (the client went away, a gRPC
//! deadline passed).
//!
//! Spawning every run would cost each covered request a task, the move of
//! its future into the task and a wake-up across tasks when it ends; most
//! runs end while their client still waits, so they run where the request
//! already is and only the abandoned ones pay for a task.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use idem::store::BoxFuture;

/// A run polled in place until it ends, or spawned when dropped before.
pub(crate) struct Detachable<T: Send + 'static> {
    run: Option<BoxFuture<'static, T>>,
}

impl<T: Send + 'static> Detachable<T> {
    /// Wraps `run`, which must carry whatever keeps it counted (a task
    /// tracker's token) and its span, since it may end in a task of its own.
    pub(crate) fn new(run: impl Future<Output = T> + Send + 'static) -> Self {
        Self {
            run: Some(Box::pin(run)),
        }
    }
}

impl<T: Send + 'static> Future for Detachable<T> {
    /// The run's output, or what stopped it: the message of a panic.
    type Output = Result<T, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(run) = self.run.as_mut() else {
            return Poll::Ready(Err("the run was polled after it ended".to_owned()));
        };
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| run.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.run = None;
                Poll::Ready(Ok(output))
            }
            Err(panic) => {
                // What a panicking run left behind is not polled again.
                self.run = None;
                Poll::Ready(Err(panic_message(panic.as_ref())))
            }
        }
    }
}

impl<T: Send + 'static> Drop for Detachable<T> {
    fn drop(&mut self) {
        let Some(run) = self.run.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(run)),
            // Only a future dropped outside any runtime lands here: the
            // process is ending, and the key's lease runs out as after a
            // crash.
            Err(_) => tracing::warn!("a run left by its client was dropped outside a runtime"),
        }
    }
}

/// A panic's message, as far as its payload tells it.
fn panic_message(panic: &(dyn Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(message), _) => format!("it panicked: {message}"),
        (None, Some(message)) => format!("it panicked: {message}"),
        (None, None) => "it panicked".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_run_that_ends_in_place_gives_its_output() {
        assert_eq!(Detachable::new(async { 7 }).await, Ok(7));
    }

    #[tokio::test]
    async fn a_dropped_run_finishes_in_a_task_of_its_own() {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let finished = Arc::new(AtomicBool::new(false));
        let run = {
            let finished = Arc::clone(&finished);
            Detachable::new(async move {
                let _ = started_tx.send(());
                tokio::time::sleep(Duration::from_millis(50)).await;
                finished.store(true, Ordering::SeqCst);
            })
        };
        let waiting = tokio::spawn(run);
        started_rx.await.expect("the run started");
        waiting.abort();
        let stopped = waiting.await.expect_err("the waiting task was aborted");
        assert!(stopped.is_cancelled());
        assert!(!finished.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            finished.load(Ordering::SeqCst),
            "the dropped run did not finish"
        );
    }

    #[tokio::test]
    async fn a_panic_is_an_error_that_names_it() {
        let run = Detachable::new(async {
            if true {
                panic!("boom");
            }
        });
        assert_eq!(run.await, Err("it panicked: boom".to_owned()));
    }
}
