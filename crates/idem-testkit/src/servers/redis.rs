//! Real Redis servers for tests: a standalone server or a Cluster
//! ([`RedisCluster`]) on free loopback ports, each a child process of the
//! test.
//!
//! Every `redis-server` runs under a small `sh` watchdog that holds the
//! read end of a pipe from the test process: when the test process exits
//! — even without running destructors, as with servers kept in a
//! `static` — the pipe closes and the watchdog kills its server by PID.
//! Nothing is killed by name or port, and no negative PID is ever used.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::servers::cluster::{ClusterSpec, RedisCluster};
use crate::servers::{failed, which};
pub use crate::servers::{free_port, ServerError};

/// The watchdog: starts the server, waits for its stdin to close, then
/// kills the server (SIGKILL: a crash, as far as Redis can tell). The PID
/// is checked to be a plain positive number and passed after `--`, so the
/// kill can only ever reach that one process. `$0` is the server's
/// directory: removed after the kill when the pipe just closed (the test
/// process exited, a server kept in a `static` included), kept when the
/// first line read is `keep` ([`RedisServer::stop`], for a restart).
const WATCHDOG: &str = r#"redis-server "$@" & pid=$!; read -r keep; case "$pid" in ''|0|*[!0-9]*) exit 1 ;; esac; kill -s KILL -- "$pid"; wait "$pid"; [ "$keep" = keep ] && exit 0; case "$0" in /tmp/idem-redis-*) rm -rf -- "$0" ;; esac"#;

/// One `redis-server` child process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    process: Option<(Child, ChildStdin)>,
}

impl RedisServer {
    /// The server every test of this process shares, without
    /// persistence; started on first use.
    pub fn shared() -> Result<&'static RedisServer, ServerError> {
        static SHARED: std::sync::OnceLock<Result<RedisServer, String>> =
            std::sync::OnceLock::new();
        SHARED
            .get_or_init(|| Self::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| failed(e.clone()))
    }

    /// Starts a server without persistence on a free loopback port.
    pub fn start() -> Result<Self, ServerError> {
        Self::start_with(free_port()?, &[])
    }

    /// Starts a server on `port` with extra `redis-server` arguments.
    pub fn start_with(port: u16, extra: &[&str]) -> Result<Self, ServerError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("idem-redis-{port}-"))
            .tempdir()
            .map_err(|e| failed(format!("temporary directory: {e}")))?
            .keep();
        let mut server = Self {
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            process: None,
        };
        server.start_again()?;
        Ok(server)
    }

    /// Starts a replica of `master` on a free port (with extra arguments)
    /// and returns once both sides are [in sync](Self::in_sync).
    pub fn replica_of(master: &RedisServer, extra: &[&str]) -> Result<Self, ServerError> {
        let port = master.port().to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &port];
        args.extend(extra);
        let replica = Self::start_with(free_port()?, &args)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(replica.in_sync()? && master.in_sync()?) {
            if Instant::now() > deadline {
                return Err(failed("the replica did not sync in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(replica)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Its port stays
    /// reserved for [`start_again`](Self::start_again).
    pub fn stop(&mut self) {
        if let Some((mut child, mut stdin)) = self.process.take() {
            let _ = writeln!(stdin, "keep");
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Whether the server is running (not [stopped](Self::stop)).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Kills the server and empties its directory (its append-only file,
    /// a Cluster node's `nodes.conf`): the next
    /// [`start_again`](Self::start_again) starts a new, empty server, as
    /// a machine replaced after a failure would.
    pub fn wipe(&mut self) -> Result<(), ServerError> {
        self.stop();
        std::fs::remove_dir_all(&self.dir)
            .and_then(|()| std::fs::create_dir_all(&self.dir))
            .map_err(|e| failed(format!("emptying {}: {e}", self.dir.display())))
    }

    /// Starts the server again on the same port, with the same arguments
    /// (an empty dataset, unless the arguments enable persistence).
    pub fn start_again(&mut self) -> Result<(), ServerError> {
        self.stop();
        let port = self.port.to_string();
        let mut args: Vec<&str> = vec![
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ];
        let dir = self.dir.to_string_lossy().into_owned();
        let log = self.log().to_string_lossy().into_owned();
        args.extend(["--dir", &dir, "--logfile", &log]);
        args.extend(self.extra.iter().map(String::as_str));
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(&self.dir)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| failed(format!("spawning sh: {e}")))?;
        let stdin = child.stdin.take().ok_or_else(|| failed("no stdin pipe"))?;
        self.process = Some((child, stdin));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if ping(self.port) {
                return Ok(());
            }
            if let Some((child, _)) = self.process.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.process = None;
                    return Err(if which("redis-server") {
                        failed(format!("redis-server on port {port} exited: {status}"))
                    } else {
                        ServerError::NotInstalled("redis-server")
                    });
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(failed(format!(
            "redis-server on port {port} did not answer PING in 10 s; its log ends:\n{}",
            self.log_tail(5)
        )))
    }

    /// The server's log file (in its directory).
    fn log(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The last `lines` lines of the server's log, for errors.
    fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Sends one command (space-separated words) with `redis-cli` and
    /// returns its output.
    pub fn cli(&self, command: &str) -> Result<String, ServerError> {
        cli(self.port, command)
    }

    /// Whether replication is settled as seen from this server: a replica
    /// has its link to the master up, and a master counts every replica
    /// it knows as `online` (a replica that has just loaded its copy is
    /// up on its side before its master counts it, and until then a
    /// `WAIT` on the master does not count it either).
    pub fn in_sync(&self) -> Result<bool, ServerError> {
        let info = self.cli("INFO replication")?;
        if info.contains("role:slave") {
            return Ok(info.contains("master_link_status:up"));
        }
        Ok(info
            .lines()
            .filter(|l| {
                l.strip_prefix("slave")
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            })
            .all(|l| l.contains("state=online")))
    }

    /// The CPU time the server has used since it started (its own user
    /// and system time from `INFO cpu`), for benchmarks that say where
    /// the time went.
    pub fn cpu(&self) -> Result<Duration, ServerError> {
        let info = self.cli("INFO cpu")?;
        let seconds: f64 = info
            .lines()
            .filter_map(|l| {
                l.strip_prefix("used_cpu_sys:")
                    .or_else(|| l.strip_prefix("used_cpu_user:"))
            })
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum();
        Ok(Duration::from_secs_f64(seconds))
    }

    /// How often the server has run `command` (lower case, as `INFO
    /// commandstats` names it: `evalsha`, `hget`) since it started or
    /// since `CONFIG RESETSTAT`, and the microseconds it spent in it; zero
    /// for a command it never ran. Commands run by scripts count too.
    pub fn command_stats(&self, command: &str) -> Result<CommandStats, ServerError> {
        Ok(CommandStats::of(&self.cli("INFO commandstats")?, command))
    }
}

/// One command's line of `INFO commandstats`
/// ([`RedisServer::command_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandStats {
    /// How many times it ran.
    pub calls: u64,
    /// The microseconds it took, in all.
    pub usec: u64,
}

impl CommandStats {
    /// `command`'s line in `info`, the text of `INFO commandstats`; zero
    /// for a command it does not list.
    pub fn of(info: &str, command: &str) -> Self {
        let prefix = format!("cmdstat_{command}:");
        let mut stats = Self::default();
        let Some(line) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else {
            return stats;
        };
        for field in line.trim().split(',') {
            match field.split_once('=') {
                Some(("calls", n)) => stats.calls = n.parse().unwrap_or(0),
                Some(("usec", n)) => stats.usec = n.parse().unwrap_or(0),
                _ => {}
            }
        }
        stats
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn cli(port: u16, command: &str) -> Result<String, ServerError> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(command.split_whitespace())
        .stdin(Stdio::null())
        .output()
        .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(failed(format!(
            "redis-cli -p {port} {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(stream.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}
