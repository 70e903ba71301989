//! A real MariaDB server for tests: `mariadb-install-db` into a temporary
//! directory and `mariadbd` on a free loopback port, a child process of
//! the test.
//!
//! Each server keeps its temporary tables in its own directory
//! (`--tmpdir`), not in `/tmp`: a starting `mariadbd` deletes every
//! `#sql*` file in its temporary directory as a previous run's leftovers,
//! and with `/tmp` shared that pulled the tables from under another
//! test's server or `mariadb-install-db` running at the same time (seen
//! as `Unknown table 'mysql.tmp_user_sys'`).
//!
//! Like the PostgreSQL server, `mariadbd` runs under a small `sh`
//! watchdog holding the read end of a pipe from the test process. When the
//! pipe closes (the test process exited, even without destructors) the
//! watchdog kills the server (SIGKILL, by PID: to InnoDB a crash, so the
//! next start runs crash recovery) and removes its data directory.
//! [`MySqlServer::crash`] sends the same signal but keeps the data, for
//! restart tests. `root` may connect over TCP from 127.0.0.1 without a
//! password.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers::tls::Certificates;
use crate::servers::{failed, free_port, which, ServerError, Watched};

/// The watchdog: `$1` is the data directory, the rest is the `mariadbd`
/// command line. A first line of `keep` on stdin keeps the data directory
/// after the kill; end of input removes it.
const WATCHDOG: &str = r#"dir=$1; shift; "$@" & pid=$!; read -r what; case "$pid" in ''|0|*[!0-9]*) exit 1 ;; esac; kill -s KILL -- "$pid"; wait "$pid"; [ "$what" = keep ] || rm -rf -- "$dir""#;

/// One `mariadbd` child process with its own directory: the data in
/// `data/`, temporary tables in `tmp/`, and its socket, PID file and
/// error log.
#[derive(Debug)]
pub struct MySqlServer {
    port: u16,
    dir: PathBuf,
    settings: Vec<String>,
    process: Option<Watched>,
}

impl MySqlServer {
    /// Runs `mariadb-install-db` and starts the server on a free loopback
    /// port (and a socket in its data directory, for the admin client).
    pub fn start() -> Result<Self, ServerError> {
        Self::start_with(Vec::new())
    }

    /// Like [`start`](Self::start), offering TLS (clients choose with
    /// `ssl-mode`) with the server certificate and key of `certs`.
    pub fn start_tls(certs: &Certificates) -> Result<Self, ServerError> {
        Self::start_with(vec![
            format!("--ssl-cert={}", certs.cert.display()),
            format!("--ssl-key={}", certs.key.display()),
            format!("--ssl-ca={}", certs.ca.display()),
        ])
    }

    fn start_with(settings: Vec<String>) -> Result<Self, ServerError> {
        if !which("mariadbd") && !Path::new("/usr/sbin/mariadbd").is_file() {
            return Err(ServerError::NotInstalled("mariadb-server"));
        }
        let dir = tempfile::Builder::new()
            .prefix("idem-mysql-")
            .tempdir()
            .map_err(|e| failed(format!("temporary directory: {e}")))?
            .keep();
        if let Err(e) = std::fs::create_dir(temporary(&dir)) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(failed(format!("temporary tables' directory: {e}")));
        }
        // Arguments it does not know itself go to the bootstrap server.
        let out = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data(&dir).display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg(format!("--user={}", user()))
            .arg(format!("--tmpdir={}", temporary(&dir).display()))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(format!("running mariadb-install-db: {e}")))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(failed(format!(
                "mariadb-install-db failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let mut server = Self {
            port: free_port()?,
            dir,
            settings,
            process: None,
        };
        server.start_again()?;
        server.admin(
            "",
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; \
             GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION",
        )?;
        Ok(server)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database with a unique name starting with `prefix` and
    /// returns its name.
    pub fn create_database(&self, prefix: &str) -> Result<String, ServerError> {
        let name = format!("{prefix}_{:016x}", rand::random::<u64>());
        self.admin("", &format!("CREATE DATABASE {name}"))?;
        Ok(name)
    }

    /// Runs `sql` with the `mariadb` client as root in `database` (none if
    /// empty); returns its tab-separated output without column names.
    pub fn admin(&self, database: &str, sql: &str) -> Result<String, ServerError> {
        let mut cmd = Command::new("mariadb");
        cmd.arg("--no-defaults")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["--skip-ssl", "-uroot", "-N", "-B", "-e", sql]);
        if !database.is_empty() {
            cmd.arg(database);
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| failed(format!("running mariadb: {e}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(failed(format!(
                "mariadb {sql:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("mysqld.sock")
    }

    /// The CPU time the server has used so far (user and system). Zero
    /// where `/proc` is not there.
    pub fn cpu(&self) -> Duration {
        self.process
            .as_ref()
            .and_then(|watched| {
                // The watchdog's child is the server.
                let pid = watched.pid();
                let children =
                    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
                let server = children.split_whitespace().next()?.to_owned();
                crate::bench::proc_ticks(&server)
            })
            .map_or(Duration::ZERO, |t| crate::bench::ticks(t.own))
    }

    /// Kills the server (SIGKILL: to InnoDB, a crash; open connections
    /// are cut and the next start runs crash recovery) and keeps its data.
    /// Its port stays reserved for [`start_again`](Self::start_again).
    pub fn crash(&mut self) {
        if let Some(watched) = self.process.take() {
            watched.stop_keeping_data();
        }
    }

    /// Starts the server again on the same port with the same data.
    pub fn start_again(&mut self) -> Result<(), ServerError> {
        self.crash();
        let _ = std::fs::remove_file(self.socket());
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(&self.dir)
            .arg(if which("mariadbd") {
                "mariadbd"
            } else {
                "/usr/sbin/mariadbd"
            })
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data(&self.dir).display()))
            .arg(format!("--tmpdir={}", temporary(&self.dir).display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", self.socket().display()))
            .arg(format!(
                "--pid-file={}",
                self.dir.join("mysqld.pid").display()
            ))
            .arg(format!(
                "--log-error={}",
                self.dir.join("error.log").display()
            ))
            .arg(format!("--user={}", user()))
            .args([
                "--max-connections=400",
                "--innodb-buffer-pool-size=64M",
                "--skip-name-resolve",
            ])
            .args(&self.settings);
        let log = || std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
        let watched = Watched::start(cmd, "mariadbd", self.port, Duration::from_secs(60))
            .map_err(|e| failed(format!("{e}\n{}", log())))?;
        self.process = Some(watched);
        // It listens before the socket the admin client uses is ready.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.socket().exists() && self.admin("", "SELECT 1").is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(failed(format!(
            "mariadbd on port {} did not answer on its socket in 30 s\n{}",
            self.port,
            log()
        )))
    }
}

/// Where a server in `dir` keeps its data.
fn data(dir: &Path) -> PathBuf {
    dir.join("data")
}

/// Where a server in `dir` keeps its temporary tables.
fn temporary(dir: &Path) -> PathBuf {
    dir.join("tmp")
}

/// The user the server runs as: this process's (MariaDB runs as root
/// when told to).
fn user() -> String {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    match std::env::var("USER") {
        Ok(user) if !root && !user.is_empty() => user,
        _ => "root".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::MySqlServer;

    /// A starting server must not take another server's temporary tables
    /// from the shared temporary directory: it deletes each `#sql*` file
    /// in its own `--tmpdir`.
    #[test]
    fn a_starting_server_leaves_other_servers_temporary_tables_alone() {
        let other = std::env::temp_dir().join(format!(
            "#sql-temptable-idem{:x}-1-4.MAI",
            rand::random::<u64>()
        ));
        std::fs::write(&other, b"another server's table").expect("write the file");
        let server = MySqlServer::start().expect("start mariadb");
        assert_eq!(server.admin("", "SELECT 1").expect("query"), "1");
        let kept = std::fs::read(&other);
        let _ = std::fs::remove_file(&other);
        assert_eq!(
            kept.expect("the other server's temporary table is still there"),
            b"another server's table"
        );
    }
}
