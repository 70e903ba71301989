//! Start-up checks: records must outlive the broker's redelivery window,
//! and heartbeats must beat the broker's redelivery timer.

use std::time::Duration;

use idem::{Codec, Idempotency, Store};

/// One way a broker can deliver a message again, and for how long after
/// its first delivery: a queue's message TTL, a stream's `max_age`, a
/// topic's `retention.ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedeliveryWindow {
    /// The broker setting, named so the user can find it, e.g.
    /// `stream "ORDERS" max_age`.
    pub setting: String,
    /// How long after its first delivery a message can still be delivered.
    /// `None` when the broker keeps messages without limit.
    pub window: Option<Duration>,
}

impl RedeliveryWindow {
    /// A bounded window.
    pub fn new(setting: impl Into<String>, window: Duration) -> Self {
        Self {
            setting: setting.into(),
            window: Some(window),
        }
    }

    /// A setting under which messages are kept without limit.
    pub fn unbounded(setting: impl Into<String>) -> Self {
        Self {
            setting: setting.into(),
            window: None,
        }
    }
}

/// A configuration under which a duplicate could run again, refused at
/// start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// Records expire before the broker stops redelivering.
    #[error(
        "{setting} lets the broker deliver a message again up to {window:?} after the first \
         delivery, but {which} is only {retention:?}: a late duplicate would find no record and \
         run again. Set {which} above {window:?}, or lower {setting}"
    )]
    RetentionTooShort {
        /// The broker setting.
        setting: String,
        /// Its window.
        window: Duration,
        /// `retention` or `failure_retention`.
        which: &'static str,
        /// The executor's value.
        retention: Duration,
    },
    /// The broker keeps messages without limit, so no retention covers it.
    #[error(
        "{setting} keeps messages without limit, so no record retention covers every duplicate; \
         give it a limit below the retention of {retention:?}"
    )]
    Unbounded {
        /// The broker setting.
        setting: String,
        /// The executor's retention.
        retention: Duration,
    },
    /// The broker would redeliver a message whose handler is still running,
    /// between two heartbeats.
    #[error(
        "{setting} of {timer:?} is not longer than the heartbeat interval of {heartbeat:?}: the \
         broker would redeliver a message while its handler still runs. Set {setting} above \
         {heartbeat:?} (twice is comfortable), or heartbeat more often"
    )]
    HeartbeatTooSlow {
        /// The broker setting.
        setting: String,
        /// Its redelivery timer.
        timer: Duration,
        /// The executor's heartbeat interval.
        heartbeat: Duration,
    },
}

pub(crate) fn check<S: Store, C: Codec>(
    idem: &Idempotency<S, C>,
    windows: &[RedeliveryWindow],
) -> Result<(), WindowError> {
    for w in windows {
        let Some(window) = w.window else {
            return Err(WindowError::Unbounded {
                setting: w.setting.clone(),
                retention: idem.retention(),
            });
        };
        for (which, retention) in [
            ("retention", idem.retention()),
            ("failure_retention", idem.failure_retention()),
        ] {
            if retention <= window {
                return Err(WindowError::RetentionTooShort {
                    setting: w.setting.clone(),
                    window,
                    which,
                    retention,
                });
            }
        }
    }
    Ok(())
}

/// Checks that a broker's redelivery timer for unacknowledged messages
/// (JetStream `ack_wait`, SQS visibility timeout) outlasts the heartbeat
/// that keeps it from firing.
pub fn check_keep_alive<S: Store, C: Codec>(
    idem: &Idempotency<S, C>,
    setting: &str,
    timer: Duration,
) -> Result<(), WindowError> {
    let heartbeat = idem.heartbeat_interval();
    if timer <= heartbeat {
        return Err(WindowError::HeartbeatTooSlow {
            setting: setting.to_owned(),
            timer,
            heartbeat,
        });
    }
    Ok(())
}
