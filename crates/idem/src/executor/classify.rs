//! Which handler errors are worth retrying, and how long to wait before
//! the next attempt.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use crate::record::FailureClass;
use crate::store::BoxError;

/// Decides whether a handler's error is worth retrying.
pub type Classifier = Arc<dyn Fn(&(dyn StdError + 'static)) -> FailureClass + Send + Sync>;

/// Marks an error as terminal for the default classifier: return it (or
/// an error whose `source()` chain contains it) from a handler and the
/// failure is recorded and replayed instead of retried.
///
/// ```
/// let e = idem::Terminal::new("card declined");
/// assert_eq!(e.to_string(), "card declined");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Terminal {
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl Terminal {
    /// A terminal error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    /// A terminal error wrapping another error.
    pub fn wrap(source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Self {
            message: source.to_string(),
            source: Some(source),
        }
    }
}

/// The default classifier: terminal if the error or any of its sources is
/// a [`Terminal`], retryable otherwise (the max-attempts limit turns a
/// poison message into a terminal failure).
pub fn default_classifier(error: &(dyn StdError + 'static)) -> FailureClass {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<Terminal>() {
            return FailureClass::Terminal;
        }
        current = e.source();
    }
    FailureClass::Retryable
}

/// Exponential backoff with jitter, for the `retry_after` of retryable
/// failures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// 200 ms, doubling per attempt, capped at 5 minutes.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// Backoff starting at `initial`, doubling per attempt, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
        }
    }

    /// The longest delay this backoff gives.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay after failed attempt `attempt` (1-based): the capped
    /// exponential value with "equal jitter" (uniform in its upper half), so
    /// it never collapses to zero and herds are spread.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let base = self
            .initial
            .saturating_mul(1u32 << exp.min(31))
            .min(self.max);
        let half = base / 2;
        let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(rand::random_range(0..=jitter_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters_within_bounds() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        for _ in 0..100 {
            let d1 = b.delay(1);
            assert!(
                d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100),
                "{d1:?}"
            );
            let d3 = b.delay(3);
            assert!(
                d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400),
                "{d3:?}"
            );
            let big = b.delay(u32::MAX);
            assert!(
                big >= Duration::from_millis(500) && big <= Duration::from_secs(1),
                "{big:?}"
            );
        }
    }

    #[test]
    fn classifier_finds_terminal_in_the_source_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] Terminal);
        assert_eq!(
            default_classifier(&Outer(Terminal::new("no"))),
            FailureClass::Terminal
        );
        assert_eq!(
            default_classifier(&std::io::Error::other("x")),
            FailureClass::Retryable
        );
        assert_eq!(
            default_classifier(&Terminal::wrap(std::io::Error::other("x"))),
            FailureClass::Terminal
        );
    }
}
