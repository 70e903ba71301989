//! MCP tool calls through the gateway (`--mcp`), both ends the official
//! MCP Python SDK (`tests/sdk/mcp_server.py`, `tests/sdk/mcp_agent.py`):
//! an agent that calls a tool and retries with the same key, from the same
//! session, concurrently from two sessions, and from a new session after
//! a restart, gets one run per key, and each replay answers its own
//! JSON-RPC id with the result marked replayed in `_meta`.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// The MCP server on a free port, once it accepts connections; its
/// output goes to `log`.
async fn start_server(runs: &std::path::Path, log: &std::path::Path) -> (Child, SocketAddr) {
    let port = idem_testkit::free_port().expect("a free port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/mcp_server.py");
    let mut child = Command::new(sdk_python())
        .arg(script)
        .arg(port.to_string())
        .arg(runs)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .kill_on_drop(true)
        .spawn()
        .expect("start the MCP server");
    for _ in 0..200 {
        if TcpStream::connect(addr).await.is_ok() {
            return (child, addr);
        }
        if let Some(status) = child.try_wait().expect("poll") {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("the MCP server exited: {status}\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the MCP server did not listen on {addr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_retrying_a_tool_call_through_the_gateway_runs_it_once_per_key() {
    let dir = tempfile::tempdir().expect("dir");
    let runs = dir.path().join("runs");
    let (mut server, addr) = start_server(&runs, &dir.path().join("server.log")).await;
    let mut cfg = config(addr);
    cfg.mcp = Some(idem_http::MCP_KEY_ARGUMENT.to_owned());
    let gw = Gateway::start(sqlite(&dir), cfg).await;

    let calls = run_sdk_script("mcp_agent.py", &[format!("{}/mcp", gw.url)]).await;
    let call = |name: &str| {
        calls
            .iter()
            .find(|c| c["call"] == name)
            .unwrap_or_else(|| panic!("no {name} call in {calls:?}"))
            .clone()
    };
    for c in &calls {
        assert_eq!(c["error"], false, "{c}");
    }
    let first = call("first");
    assert_eq!(first["replayed"], false);
    for retry in ["retry", "after-restart"] {
        let retry = call(retry);
        assert_eq!(retry["text"], first["text"], "{retry}");
        assert_eq!(retry["replayed"], true, "{retry}");
    }
    let (a, b) = (call("concurrent-a"), call("concurrent-b"));
    assert_eq!(a["text"], b["text"], "one run for both: {a} {b}");
    assert_eq!(
        [&a, &b].iter().filter(|c| c["replayed"] == true).count(),
        1,
        "one ran, the other waited for its result: {a} {b}"
    );
    assert_eq!(call("other-order")["replayed"], false);

    let ran = std::fs::read_to_string(&runs).expect("runs");
    let mut keys: Vec<&str> = ran
        .lines()
        .map(|l| l.split(' ').next().unwrap_or(""))
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["key-1", "key-2", "key-3"], "one run per key: {ran}");

    gw.shutdown().await;
    server.kill().await.expect("stop the MCP server");
}
