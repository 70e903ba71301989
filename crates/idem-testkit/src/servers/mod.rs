//! The real servers the tests run, each started on a free loopback port
//! for one run (PostgreSQL, MariaDB, Redis standalone and Cluster, RabbitMQ, NATS
//! JetStream, a Kafka-protocol broker, moto for AWS, a local Lambda runtime
//! with the `lambda` feature), and what they share:
//! their error, free ports, and finding programs.

pub(crate) mod cluster;
pub mod kafka;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod moto;
pub mod mysql;
pub mod nats;
mod ports;
pub mod postgres;
pub mod rabbitmq;
pub mod redis;
pub mod tls;

pub use ports::free_port;
pub(crate) use ports::free_run;

use std::ffi::OsStr;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A program the server needs is not installed (`scripts/test`
    /// installs them: `redis-server`, `redis-tools`, `postgresql`,
    /// `mariadb-server`).
    #[error("{0} is not installed")]
    NotInstalled(&'static str),
    /// Starting or talking to the server failed.
    #[error("{what}")]
    Failed {
        /// What went wrong.
        what: String,
    },
}

pub(crate) fn failed(what: impl Into<String>) -> ServerError {
    ServerError::Failed { what: what.into() }
}

pub(crate) fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// A program `scripts/test` installs into the tools cache: the path in
/// `env_var` if set, then `name` on `PATH`, then
/// `~/.cache/idem/tools/<cached>`.
pub(crate) fn tool(env_var: &str, name: &str, cached: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env_var) {
        return Some(PathBuf::from(path));
    }
    if which(name) {
        return Some(PathBuf::from(name));
    }
    let home = std::env::var_os("HOME")?;
    let path = PathBuf::from(home).join(".cache/idem/tools").join(cached);
    path.is_file().then_some(path)
}

/// The watchdog for a server that needs nothing but killing: `$0` is the
/// program, the rest its arguments.
const WATCHDOG: &str = r#""$0" "$@" & pid=$!; read -r _; case "$pid" in ''|0|*[!0-9]*) exit 1 ;; esac; kill -s KILL -- "$pid"; wait "$pid""#;

/// Whether something accepts connections on the loopback `port`.
pub(crate) fn listening(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}

/// Waits up to `limit` for `program`, started under `child`, to listen on
/// `port`; says why not otherwise (it exited, or it never listened).
pub(crate) fn wait_listening(
    child: &mut Child,
    program: &str,
    port: u16,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if listening(port) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{program} exited: {status}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{program} did not listen on port {port} in {} s",
        limit.as_secs()
    ))
}

/// A server running under an `sh` watchdog that holds a pipe from the
/// test process and kills the server by PID when the pipe closes: when
/// this is dropped (it then waits for the watchdog), or when the test
/// process exits.
#[derive(Debug)]
pub(crate) struct Watched {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watched {
    /// Spawns `watchdog` (an `sh -c` command) with its stdin piped and its
    /// output discarded, and waits up to `limit` for `program` to listen
    /// on `port`.
    pub(crate) fn start(
        mut watchdog: Command,
        program: &str,
        port: u16,
        limit: Duration,
    ) -> Result<Self, ServerError> {
        let mut child = watchdog
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| failed(format!("spawning sh: {e}")))?;
        let stdin = child.stdin.take().ok_or_else(|| failed("no stdin pipe"))?;
        let mut watched = Self {
            child,
            stdin: Some(stdin),
        };
        wait_listening(&mut watched.child, program, port, limit).map_err(failed)?;
        Ok(watched)
    }
}

impl Watched {
    /// Runs `program` with `args` under the plain watchdog (SIGKILL by PID
    /// when the pipe closes) and waits up to `limit` for it to listen on
    /// `port`; `name` is what errors call it.
    pub(crate) fn program<I, A>(
        program: &Path,
        args: I,
        name: &str,
        port: u16,
        limit: Duration,
    ) -> Result<Self, ServerError>
    where
        I: IntoIterator<Item = A>,
        A: AsRef<OsStr>,
    {
        let mut watchdog = Command::new("sh");
        watchdog.arg("-c").arg(WATCHDOG).arg(program).args(args);
        Self::start(watchdog, name, port, limit)
    }
}

impl Watched {
    /// The watchdog's process id (the server is its child).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server as dropping does, but tells a watchdog that
    /// understands it (its first line read is `keep`) to leave the
    /// server's data for a restart.
    pub(crate) fn stop_keeping_data(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "keep");
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
