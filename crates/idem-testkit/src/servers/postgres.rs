//! A real PostgreSQL server for tests: `initdb` into a temporary directory
//! and `postgres` on a free loopback port, a child process of the test.
//!
//! Like the Redis servers, `postgres` runs under a small `sh` watchdog
//! holding the read end of a pipe from the test process. When the pipe
//! closes (the test process exited, even without destructors) the
//! watchdog shuts the server down in *immediate* mode (SIGQUIT to the
//! postmaster, by PID: no checkpoint, so the next start runs crash
//! recovery) and removes its data directory. [`PgServer::crash`] sends the
//! same signal but keeps the data, for restart tests. When the test runs
//! as root, the server runs as the `postgres` user (PostgreSQL refuses to
//! run as root).

use std::fs::Permissions;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers::tls::Certificates;
use crate::servers::{failed, free_port, ServerError};

/// The watchdog: `$1` is the data directory, the rest is the `postgres`
/// command line. A first line of `keep` on stdin keeps the data directory
/// after the shutdown; end of input removes it.
const WATCHDOG: &str = r#"dir=$1; shift; "$@" & pid=$!; read -r what; case "$pid" in ''|0|*[!0-9]*) exit 1 ;; esac; kill -s QUIT -- "$pid"; wait "$pid"; [ "$what" = keep ] || rm -rf -- "$dir""#;

/// One `postgres` child process with its own data directory.
#[derive(Debug)]
pub struct PgServer {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    owner: Option<(u32, u32)>,
    settings: Vec<String>,
    process: Option<(Child, ChildStdin)>,
}

impl PgServer {
    /// Runs `initdb` (trust authentication, superuser `postgres`) and
    /// starts the server on a free loopback port, without a Unix socket.
    pub fn start() -> Result<Self, ServerError> {
        let mut server = Self::init()?;
        server.start_again()?;
        Ok(server)
    }

    /// Like [`start`](Self::start), serving TLS (`ssl=on`; clients choose
    /// with `sslmode`) with the server certificate and key of `certs`,
    /// copied into the data directory for the server's user.
    pub fn start_tls(certs: &Certificates) -> Result<Self, ServerError> {
        let mut server = Self::init()?;
        for (from, name) in [(&certs.cert, "server.crt"), (&certs.key, "server.key")] {
            let to = server.dir.join(name);
            std::fs::copy(from, &to)
                .and_then(|_| std::fs::set_permissions(&to, Permissions::from_mode(0o600)))
                .map_err(|e| {
                    failed(format!(
                        "copying {} to {}: {e}",
                        from.display(),
                        to.display()
                    ))
                })?;
            if let Some((uid, gid)) = server.owner {
                std::os::unix::fs::chown(&to, Some(uid), Some(gid))
                    .map_err(|e| failed(format!("chown {}: {e}", to.display())))?;
            }
        }
        server.settings = [
            "ssl=on",
            "ssl_cert_file=server.crt",
            "ssl_key_file=server.key",
        ]
        .map(String::from)
        .to_vec();
        server.start_again()?;
        Ok(server)
    }

    /// `initdb` into a new temporary directory; not started.
    fn init() -> Result<Self, ServerError> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("idem-pg-")
            .tempdir()
            .map_err(|e| failed(format!("temporary directory: {e}")))?
            .keep();
        let owner = postgres_user_if_root()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| failed(format!("chown {}: {e}", dir.display())))?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&dir)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null());
        if let Some((uid, gid)) = owner {
            initdb.uid(uid).gid(gid);
        }
        let out = initdb
            .output()
            .map_err(|e| failed(format!("running initdb: {e}")))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(failed(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(Self {
            bin,
            port: free_port()?,
            dir,
            owner,
            settings: Vec::new(),
            process: None,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The CPU time the server has used so far: the postmaster's and its
    /// processes' (backends, writers), those that exited included. Zero
    /// where `/proc` is not there.
    pub fn cpu(&self) -> Duration {
        let Some(postmaster) = std::fs::read_to_string(self.dir.join("postmaster.pid"))
            .ok()
            .and_then(|pid| pid.lines().next().map(str::to_owned))
        else {
            return Duration::ZERO;
        };
        let parent: u32 = postmaster.parse().unwrap_or(0);
        // A process that exits and is reaped between the two reads of the
        // postmaster would count in neither: read again until none did.
        for _ in 0..10 {
            let Some(before) = crate::bench::proc_ticks(&postmaster) else {
                return Duration::ZERO;
            };
            let children: u64 = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| crate::bench::proc_ticks(entry.file_name().to_str()?))
                .filter(|t| t.parent == parent)
                .map(|t| t.own)
                .sum();
            let after = crate::bench::proc_ticks(&postmaster).map(|t| t.exited_children);
            if after == Some(before.exited_children) {
                return crate::bench::ticks(before.own + before.exited_children + children);
            }
        }
        Duration::ZERO
    }

    /// Creates a database with a unique name starting with `prefix` and
    /// returns its name.
    pub fn create_database(&self, prefix: &str) -> Result<String, ServerError> {
        let name = format!("{prefix}_{:016x}", rand::random::<u64>());
        self.psql("postgres", &format!("CREATE DATABASE {name}"))?;
        Ok(name)
    }

    /// Runs `sql` with `psql` in `database`; returns its unaligned output.
    pub fn psql(&self, database: &str, sql: &str) -> Result<String, ServerError> {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                database,
            ])
            .args(["-c", sql])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(format!("running psql: {e}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(failed(format!(
                "psql {sql:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Runs `pgbench` with `script` (custom script text, prepared
    /// statements) from `clients` clients for `secs` seconds against the
    /// `postgres` database; returns its transactions per second.
    pub fn pgbench(&self, script: &str, clients: usize, secs: f64) -> Result<f64, ServerError> {
        let file = tempfile::NamedTempFile::new()
            .map_err(|e| failed(format!("pgbench script file: {e}")))?;
        std::fs::write(file.path(), script)
            .map_err(|e| failed(format!("writing the pgbench script: {e}")))?;
        let out = Command::new(self.bin.join("pgbench"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-n", "-M", "prepared", "-c", &clients.to_string()])
            .args(["-j", &clients.min(2).to_string()])
            .args(["-T", &format!("{}", secs.ceil() as u64)])
            .arg("-f")
            .arg(file.path())
            .arg("postgres")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(format!("running pgbench: {e}")))?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                failed(format!(
                    "unexpected pgbench output: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            })
    }

    /// The directory of the PostgreSQL programs in use (`pgbench` is
    /// there too).
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// Shuts the server down in immediate mode — to PostgreSQL, a crash:
    /// open connections are cut and the next start runs crash recovery —
    /// and keeps its data. Its port stays reserved for
    /// [`start_again`](Self::start_again).
    pub fn crash(&mut self) {
        self.shut_down(true);
    }

    fn shut_down(&mut self, keep: bool) {
        if let Some((mut child, mut stdin)) = self.process.take() {
            if keep {
                let _ = stdin.write_all(b"keep\n");
            }
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same data.
    pub fn start_again(&mut self) -> Result<(), ServerError> {
        self.crash();
        let port = self.port.to_string();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(&self.dir)
            .arg(self.bin.join("postgres"))
            .arg("-D")
            .arg(&self.dir)
            .args(["-p", &port])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", "max_connections=300"])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| failed(format!("spawning sh: {e}")))?;
        let stdin = child.stdin.take().ok_or_else(|| failed("no stdin pipe"))?;
        self.process = Some((child, stdin));
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.ready() {
                return Ok(());
            }
            if let Some((child, _)) = self.process.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.process = None;
                    return Err(failed(format!("postgres on port {port} exited: {status}")));
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(failed(format!(
            "postgres on port {port} was not ready in 30 s"
        )))
    }

    fn ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.shut_down(false);
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb`.
fn bin_dir() -> Result<PathBuf, ServerError> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| ServerError::NotInstalled("postgresql"))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or(ServerError::NotInstalled("postgresql"))
}

/// The `postgres` user's uid and gid when this process runs as root.
fn postgres_user_if_root() -> Result<Option<(u32, u32)>, ServerError> {
    let me = std::fs::metadata("/proc/self").map_err(|e| failed(format!("/proc/self: {e}")))?;
    if me.uid() != 0 {
        return Ok(None);
    }
    let passwd =
        std::fs::read_to_string("/etc/passwd").map_err(|e| failed(format!("/etc/passwd: {e}")))?;
    passwd
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            (fields.next() == Some("postgres")).then(|| {
                let uid = fields.nth(1)?.parse().ok()?;
                let gid = fields.next()?.parse().ok()?;
                Some((uid, gid))
            })?
        })
        .map(Some)
        .ok_or_else(|| {
            failed("running as root, but there is no postgres user to run PostgreSQL as")
        })
}

/// A store statement as a `pgbench` command: comments dropped, the
/// numbered parameters replaced by pgbench expressions (`$10` before
/// `$1`), `;` at the end.
pub fn pgbench_command(sql: &str, params: &[(&str, &str)]) -> String {
    let mut text: String = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for (name, value) in params.iter().rev() {
        text = text.replace(name, value);
    }
    format!("{text};\n")
}
