//! Real Redis servers for tests: a standalone server or a 3-master Cluster
//! on free loopback ports, each a child process of the test.
//!
//! Every `redis-server` runs under a small `sh` watchdog that holds the
//! read end of a pipe from the test process: when the test process exits
//! — even without running destructors, as with servers kept in a
//! `static` — the pipe closes and the watchdog kills its server by PID.
//! Nothing is killed by name or port, and no negative PID is ever used.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::{failed, which};
pub use crate::server::{free_port, ServerError};

/// The watchdog: starts the server, waits for its stdin to close, then
/// kills the server (SIGKILL: a crash, as far as Redis can tell). The PID
/// is checked to be a plain positive number and passed after `--`, so the
/// kill can only ever reach that one process.
const WATCHDOG: &str = r#"redis-server "$@" & pid=$!; read -r _; case "$pid" in ''|0|*[!0-9]*) exit 1 ;; esac; kill -s KILL -- "$pid"; wait "$pid""#;

/// One `redis-server` child process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    process: Option<(Child, ChildStdin)>,
}

impl RedisServer {
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
        if let Some((mut child, stdin)) = self.process.take() {
            drop(stdin);
            let _ = child.wait();
        }
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
        args.extend(["--dir", &dir]);
        args.extend(self.extra.iter().map(String::as_str));
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
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
            "redis-server on port {port} did not answer PING in 10 s"
        )))
    }

    /// Sends one command (space-separated words) with `redis-cli` and
    /// returns its output.
    pub fn cli(&self, command: &str) -> Result<String, ServerError> {
        cli(self.port, command)
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three masters (no replicas) on loopback.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them; returns once
    /// every node reports `cluster_state:ok`.
    pub fn start() -> Result<Self, ServerError> {
        let base = free_cluster_ports()?;
        let mut nodes = Vec::new();
        for port in base..base + 3 {
            nodes.push(RedisServer::start_with(
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ],
            )?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
        if !out.status.success() {
            return Err(failed(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let cluster = Self { nodes };
        cluster.wait_until_ok()?;
        Ok(cluster)
    }

    /// Waits until every node reports `cluster_state:ok` and agrees on
    /// the slots.
    pub fn wait_until_ok(&self) -> Result<(), ServerError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut ok = true;
            for node in &self.nodes {
                ok &= node.cli("CLUSTER INFO")?.contains("cluster_state:ok");
            }
            if ok {
                let check = Command::new("redis-cli")
                    .args([
                        "--cluster",
                        "check",
                        &format!("127.0.0.1:{}", self.nodes[0].port()),
                    ])
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
                if check.status.success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(failed("the cluster did not reach cluster_state:ok in 20 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node id of each node, in [`nodes`](Self::nodes) order.
    pub fn node_ids(&self) -> Result<Vec<String>, ServerError> {
        self.nodes
            .iter()
            .map(|n| n.cli("CLUSTER MYID").map(|s| s.trim().to_owned()))
            .collect()
    }

    /// Moves `slots` slots from node `from` to node `to` with
    /// `redis-cli --cluster reshard` (MIGRATE under live traffic: clients
    /// meet ASK and then MOVED redirections).
    pub fn reshard(&self, from: usize, to: usize, slots: u32) -> Result<(), ServerError> {
        let ids = self.node_ids()?;
        let out = Command::new("redis-cli")
            .args(["--cluster", "reshard"])
            .arg(format!("127.0.0.1:{}", self.nodes[0].port()))
            .args(["--cluster-from", &ids[from], "--cluster-to", &ids[to]])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .args(["--cluster-pipeline", "10"])
            .stdin(Stdio::null())
            .output()
            .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(failed(format!(
                "reshard failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }
}

fn cli(port: u16, command: &str) -> Result<String, ServerError> {
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

/// Three consecutive free ports below 55535 whose cluster-bus twins
/// (+10000) are free as well.
fn free_cluster_ports() -> Result<u16, ServerError> {
    for _ in 0..200 {
        let base = 20_000 + rand::random::<u16>() % 30_000;
        let free = (base..base + 3).all(|p| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok()
                && TcpListener::bind((Ipv4Addr::LOCALHOST, p + 10_000)).is_ok()
        });
        if free {
            return Ok(base);
        }
    }
    Err(failed("no three free consecutive ports found"))
}
