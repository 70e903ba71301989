//! One error type for handlers that have none of their own.

use std::error::Error as StdError;
use std::fmt;

use crate::executor::Terminal;
use crate::machine::LeaseLost;
use crate::step::StepError;
use crate::store::{BoxError, StoreError};

/// An error type for handlers that have none of their own.
///
/// A handler's error type must implement [`std::error::Error`], so
/// `anyhow::Error` and `Box<dyn Error>` cannot be used as it. This one
/// can, and `?` converts into it whatever a first handler meets: idem's
/// own errors ([`LeaseLost`] from [`Context::checked_fence`](crate::Context::checked_fence),
/// [`StepError`] from a step, [`Terminal`], [`StoreError`]),
/// `std::io::Error`, `serde_json::Error`, a message (`String`, `&str`) and
/// a boxed error. Wrap any other with [`HandlerError::new`]
/// (`.map_err(HandlerError::new)?`; an `anyhow::Error` converts too).
///
/// It shows the error it wraps and keeps it as its source, so the
/// [default classifier](crate::default_classifier) still finds a
/// [`Terminal`] in it: a failure is retried unless you say it is
/// terminal.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use idem::{HandlerError, Idempotency, MemoryStore, RecordId, RunError};
///
/// let idem = Idempotency::builder(MemoryStore::new()).build()?;
/// let id = RecordId::parse("payments", "order-7")?;
/// let run = idem
///     .run(&id, None, |ctx| async move {
///         let fence = ctx.checked_fence()?; // LeaseLost converts
///         let amount: u64 = "1250".parse().map_err(HandlerError::new)?;
///         if amount > 1000 {
///             return Err(HandlerError::terminal("over the card's limit"));
///         }
///         Ok(format!("charged {amount} under fence {fence}"))
///     })
///     .await;
/// let Err(RunError::Handler { error, class, .. }) = run else { panic!() };
/// assert_eq!(error.to_string(), "over the card's limit");
/// assert_eq!(class, idem::FailureClass::Terminal);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct HandlerError(BoxError);

impl HandlerError {
    /// Wraps any error (or message). It is retried, unless it is or holds
    /// a [`Terminal`].
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }

    /// A failure that is recorded and replayed instead of retried: a
    /// [`Terminal`] with this message.
    pub fn terminal(message: impl Into<String>) -> Self {
        Self(Box::new(Terminal::new(message)))
    }

    /// The error it wraps.
    pub fn into_inner(self) -> BoxError {
        self.0
    }

    /// The error it wraps, if it is an `E`.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref()
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for HandlerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}

/// `From` for each type that converts by boxing it.
macro_rules! boxed_from {
    ($($error:ty),* $(,)?) => {$(
        impl From<$error> for HandlerError {
            fn from(error: $error) -> Self {
                Self::new(error)
            }
        }
    )*};
}

boxed_from!(
    LeaseLost,
    Terminal,
    StoreError,
    crate::outbox::SendError,
    std::io::Error,
    serde_json::Error,
    String,
    &str,
    BoxError,
);

impl<E: StdError + Send + Sync + 'static> From<StepError<E>> for HandlerError {
    fn from(error: StepError<E>) -> Self {
        Self::new(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{default_classifier, error_chain, FailureClass};

    #[test]
    fn a_wrapped_terminal_is_still_terminal_and_anything_else_retried() {
        let terminal = HandlerError::from(Terminal::new("declined"));
        assert_eq!(default_classifier(&terminal), FailureClass::Terminal);
        let io = HandlerError::from(std::io::Error::other("reset"));
        assert_eq!(default_classifier(&io), FailureClass::Retryable);
        assert_eq!(
            default_classifier(&HandlerError::from("no")),
            FailureClass::Retryable
        );
    }

    #[test]
    fn it_reads_as_the_error_it_wraps_once() {
        let error = HandlerError::from(StoreError::Backend("item too large".into()));
        assert_eq!(error.to_string(), "store backend error");
        assert_eq!(error_chain(&error), "store backend error: item too large");
        assert!(error.downcast_ref::<StoreError>().is_some());
        assert!(error.downcast_ref::<LeaseLost>().is_none());
    }
}
