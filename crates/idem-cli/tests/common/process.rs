//! The `idem` binary as a gateway process: started with its arguments,
//! waited for until it listens, killed and reaped when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

pub struct GatewayProcess {
    pub child: Child,
    /// `http://` and the address it listens on.
    pub url: String,
    /// `http://` and the admin listener's address, if it has one.
    pub admin_url: Option<String>,
}

impl GatewayProcess {
    /// `idem --store STORE proxy --listen 127.0.0.1:PORT --admin-listen off
    /// ARGS…` (a free port), once it accepts connections.
    pub async fn start(store: &str, args: &[&str]) -> Self {
        Self::spawn(store, false, args).await
    }

    /// As [`start`](Self::start), with the admin listener on a free port
    /// (its address in [`admin_url`](Self::admin_url)).
    pub async fn start_with_admin(store: &str, args: &[&str]) -> Self {
        Self::spawn(store, true, args).await
    }

    async fn spawn(store: &str, with_admin: bool, args: &[&str]) -> Self {
        let address = || format!("127.0.0.1:{}", idem_testkit::free_port().expect("port"));
        let listen = address();
        let admin = if with_admin {
            address()
        } else {
            "off".to_owned()
        };
        let child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["--store", store])
            .args(["proxy", "--listen", &listen, "--admin-listen", &admin])
            .args(args)
            .env("IDEM_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start idem proxy");
        let mut gateway = Self {
            child,
            url: format!("http://{listen}"),
            admin_url: with_admin.then(|| format!("http://{admin}")),
        };
        let start = Instant::now();
        while TcpStream::connect(&listen).await.is_err()
            || (with_admin && TcpStream::connect(&admin).await.is_err())
        {
            if let Ok(Some(exit)) = gateway.child.try_wait() {
                panic!("idem proxy {args:?} exited at start: {exit}");
            }
            assert!(start.elapsed() < Duration::from_secs(10), "gateway not up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        gateway
    }

    /// The process's peak resident memory, in bytes (`VmHWM`).
    pub fn peak_rss(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmHWM");
        kib * 1024
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `idem --store STORE purge`, run as its own process (as an operator
/// would, beside a running gateway); what it printed.
pub fn purge(store: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", store, "purge"])
        .output()
        .expect("idem purge");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A gateway on `store` keeping records 1 s (lease 1 s; and `args`), in
/// front of an upstream of its own: `POST /charge` with key `order-1`,
/// answered 201, and the same request again once the retention has
/// passed. The upstream, the gateway, the URL and the late retry's answer.
pub async fn late_retry(
    store: &str,
    args: &[&str],
) -> (super::Upstream, GatewayProcess, String, reqwest::Response) {
    let (up, addr) = super::start_upstream().await;
    let upstream = format!("http://{addr}");
    let mut all = vec![
        "--upstream",
        &upstream,
        "--lease",
        "1s",
        "--retention",
        "1s",
    ];
    all.extend_from_slice(args);
    let gw = GatewayProcess::start(store, &all).await;
    let url = format!("{}/charge", gw.url);
    assert_eq!(super::post(&url, Some("order-1")).await.status(), 201);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = super::post(&url, Some("order-1")).await;
    (up, gw, url, late)
}
