//! [`EngineOptions`]: how an engine runs its keys.

use std::num::NonZeroU32;
use std::time::Duration;

/// How an [`Engine`](crate::Engine) runs its keys; `Default` is the executor's defaults
/// (a 30 s lease, a day's retention, no waiting for a duplicate in flight).
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// How long a claim is held without a heartbeat (the heartbeat extends
    /// it every third of it while the run lives).
    pub lease: Option<Duration>,
    /// How long results are kept and replayed.
    pub retention: Option<Duration>,
    /// How long terminal failures are kept and replayed.
    pub failure_retention: Option<Duration>,
    /// How long a claim waits for a duplicate in flight to finish, by
    /// default.
    pub wait: Option<Duration>,
    /// Attempts after which a retryable failure is recorded as terminal.
    pub max_attempts: Option<NonZeroU32>,
    /// The largest result stored, in bytes.
    pub max_result_bytes: Option<usize>,
    /// The token for a remote `idem serve` (`http(s)://` URLs).
    pub token: Option<String>,
    /// A keyring file (`id:64-hex-digits` a line, newest first) whose
    /// first key seals every stored result and step result; the others
    /// still open what they sealed. Not for a remote `idem serve`.
    pub keyring: Option<std::path::PathBuf>,
    /// A file holding the secret (64 hex digits) keys are hashed with at
    /// rest: records are stored under a keyed hash of their scope and key.
    /// It never rotates. Not for a remote `idem serve`.
    pub key_secret: Option<std::path::PathBuf>,
    /// The broker a run's messages go to ([`RunContext::send`](crate::RunContext::send)):
    /// an outbox URL ([`SenderUrl`](crate::SenderUrl): `amqp://`,
    /// `nats://`, `kafka://`, `sqs://`, each behind its feature). The
    /// messages are stored with the run's completion and sent after it;
    /// the engine runs the dispatcher for those a process that died left
    /// unsent. Not for a remote `idem serve`: there a run's messages go
    /// with its completion, and the server sends them (`idem serve
    /// --outbox URL`) or leaves them to `idem outbox run`.
    pub outbox: Option<String>,
}
