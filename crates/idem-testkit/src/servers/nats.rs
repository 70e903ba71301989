//! A NATS server with JetStream for tests, as a child process on a free
//! loopback port, with its store in a temporary directory.
//!
//! It runs under an `sh` watchdog holding a pipe from the test process:
//! when the test process exits, the watchdog kills the server by PID and
//! removes its directory. [`NatsServer::restart`] kills it the same way
//! but keeps the directory, and starts it again on it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::servers::{failed, which, Watched};
pub use crate::servers::{free_port, ServerError};

/// The watchdog: `$0` is the store directory, removed after the kill.
/// A first line `keep` leaves the directory, for a restart.
const WATCHDOG: &str = r#"nats-server "$@" & pid=$!; read -r keep; case "$pid" in ''|0|*[!0-9]*) exit 1 ;; esac; kill -s KILL -- "$pid"; wait "$pid"; [ "$keep" = keep ] && exit 0; case "$0" in /tmp/idem-nats-*) rm -rf -- "$0" ;; esac"#;

/// One `nats-server -js` child process.
#[derive(Debug)]
pub struct NatsServer {
    port: u16,
    dir: PathBuf,
    process: Option<Watched>,
}

impl NatsServer {
    /// The server every test of this binary uses; started on first use.
    /// Tests isolate themselves by unique stream and subject names.
    pub fn shared() -> Result<&'static NatsServer, ServerError> {
        static SHARED: OnceLock<Result<NatsServer, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Self::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| failed(e.clone()))
    }

    /// Starts a server with JetStream on a free loopback port.
    pub fn start() -> Result<Self, ServerError> {
        if !which("nats-server") {
            return Err(ServerError::NotInstalled("nats-server"));
        }
        let port = free_port()?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("idem-nats-{port}-"))
            .tempdir()
            .map_err(|e| failed(format!("temporary directory: {e}")))?
            .keep();
        let process = Self::spawn(port, &dir)?;
        Ok(Self {
            port,
            dir,
            process: Some(process),
        })
    }

    fn spawn(port: u16, dir: &Path) -> Result<Watched, ServerError> {
        let mut watchdog = Command::new("sh");
        watchdog
            .arg("-c")
            .arg(WATCHDOG)
            .arg(dir)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir);
        Watched::start(watchdog, "nats-server", port, Duration::from_secs(10))
    }

    /// Kills the server (SIGKILL, as a crash would) and starts it again on
    /// the same port with the same JetStream store; returns once it
    /// listens again.
    pub fn restart(&mut self) -> Result<(), ServerError> {
        if let Some(process) = self.process.take() {
            process.stop_keeping_data();
        }
        self.process = Some(Self::spawn(self.port, &self.dir)?);
        Ok(())
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        // The server stops before its directory goes.
        drop(self.process.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
