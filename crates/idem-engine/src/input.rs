//! Numbers a binding hands over, read the same way for every language:
//! durations in the language's own unit, attempt counts.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::error::EngineError;

/// The unit a language gives durations in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds (Python's convention).
    Seconds,
    /// Milliseconds (JavaScript's convention).
    Millis,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Seconds => "seconds",
            Unit::Millis => "milliseconds",
        }
    }
}

/// The setting `name`, `value` in `unit`s, as a duration: finite, not
/// negative, within what a duration holds.
pub fn duration(
    name: &str,
    value: Option<f64>,
    unit: Unit,
) -> Result<Option<Duration>, EngineError> {
    value
        .map(|v| {
            let secs = match unit {
                Unit::Seconds => v,
                Unit::Millis => v / 1000.0,
            };
            Duration::try_from_secs_f64(secs).map_err(|_| {
                EngineError::Config(format!(
                    "{name} must be a finite, non-negative number of {}, got {v}",
                    unit.name()
                ))
            })
        })
        .transpose()
}

/// The setting `name`, an attempt count: at least 1.
pub fn attempts(name: &str, value: Option<u32>) -> Result<Option<NonZeroU32>, EngineError> {
    value
        .map(|n| {
            NonZeroU32::new(n)
                .ok_or_else(|| EngineError::Config(format!("{name} must be at least 1")))
        })
        .transpose()
}
