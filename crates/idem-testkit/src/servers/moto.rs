//! A `moto_server` (the DynamoDB- and SQS-compatible server from the
//! `moto[server]` PyPI package) for tests, as a child process on a free
//! loopback port. `scripts/test` installs it into
//! `~/.cache/idem/tools/moto`; `IDEM_MOTO_SERVER` names another binary.
//!
//! It runs under an `sh` watchdog holding a pipe from the test process:
//! when the test process exits, the watchdog kills the server by PID.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::servers::{failed, tool, Watched};
pub use crate::servers::{free_port, ServerError};

/// The credentials and region tests sign with (moto accepts any).
pub const ACCESS_KEY: &str = "idem-test";
/// See [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "idem-test-secret";
/// See [`ACCESS_KEY`].
pub const REGION: &str = "us-east-1";

/// One `moto_server` child process.
#[derive(Debug)]
pub struct MotoServer {
    port: u16,
    _process: Watched,
}

/// Where the `moto_server` program is: `IDEM_MOTO_SERVER`, then `PATH`,
/// then the virtual environment `scripts/test` makes.
pub fn program() -> Option<PathBuf> {
    tool("IDEM_MOTO_SERVER", "moto_server", "moto/bin/moto_server")
}

/// The Python that has moto: `IDEM_MOTO_PYTHON`, then the virtual
/// environment `scripts/test` makes, then the one beside a `moto_server`
/// given by path.
fn python() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("IDEM_MOTO_PYTHON") {
        return Some(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let cached = home.map(|h| h.join(".cache/idem/tools/moto/bin/python"));
    let beside = program().and_then(|p| p.parent().map(|bin| bin.join("python")));
    [cached, beside].into_iter().flatten().find(|p| p.is_file())
}

/// The server in `cell`, started by `start` on first use.
fn once(
    cell: &'static OnceLock<Result<MotoServer, String>>,
    start: fn() -> Result<MotoServer, ServerError>,
) -> Result<&'static MotoServer, ServerError> {
    cell.get_or_init(|| start().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| failed(e.clone()))
}

impl MotoServer {
    /// The server every test of this binary uses; started on first use.
    /// Tests isolate themselves by unique table and queue names.
    pub fn shared() -> Result<&'static MotoServer, ServerError> {
        static SHARED: OnceLock<Result<MotoServer, String>> = OnceLock::new();
        once(&SHARED, Self::start)
    }

    /// The serial server every test of this binary uses (see
    /// [`start_serial`](Self::start_serial)); started on first use.
    pub fn shared_serial() -> Result<&'static MotoServer, ServerError> {
        static SHARED: OnceLock<Result<MotoServer, String>> = OnceLock::new();
        once(&SHARED, Self::start_serial)
    }

    /// Starts a server that answers one request at a time. `moto_server`
    /// serves requests on threads and does not lock an item between a
    /// condition's check and its write, so under concurrent conditional
    /// writes it can let two succeed where DynamoDB lets one: tests of
    /// concurrent claims need this one. (Not for SQS: a long poll would
    /// hold every other request up.)
    pub fn start_serial() -> Result<Self, ServerError> {
        let python = python().ok_or(ServerError::NotInstalled("moto (a Python with it)"))?;
        let port = free_port()?;
        let args = [
            "-c",
            include_str!("moto_serial.py"),
            "127.0.0.1",
            &port.to_string(),
        ];
        Self::watch(&python, &args, port, "moto_server (serial)")
    }

    /// Starts a server on a free loopback port.
    pub fn start() -> Result<Self, ServerError> {
        let program = program().ok_or(ServerError::NotInstalled("moto_server"))?;
        let port = free_port()?;
        Self::watch(
            &program,
            &["-H", "127.0.0.1", "-p", &port.to_string()],
            port,
            "moto_server",
        )
    }

    /// Runs `program` with `args` and waits until it listens on `port`.
    fn watch(program: &Path, args: &[&str], port: u16, name: &str) -> Result<Self, ServerError> {
        let process = Watched::program(program, args, name, port, Duration::from_secs(30))?;
        Ok(Self {
            port,
            _process: process,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}
