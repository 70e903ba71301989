//! A Redis Cluster on loopback: three masters, optionally a replica each,
//! optionally announcing other ports to clients (fault proxies in front of
//! the nodes), with the faults a Cluster meets: a master killed and its
//! replica promoted, the dead node replaced, slots migrated.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers::redis::{cli, RedisServer};
use crate::servers::ServerError;
use crate::servers::{failed, free_run};

/// The masters of every Cluster here.
const MASTERS: usize = 3;

/// What Cluster to start; [`Default`] is three masters without replicas.
#[derive(Debug, Clone, Default)]
pub struct ClusterSpec {
    /// Replicas per master (0 or 1).
    pub replicas: usize,
    /// The nodes' ports, masters first (see [`RedisCluster::free_ports`]);
    /// empty: free ports are chosen.
    pub ports: Vec<u16>,
    /// For each node, the port it tells clients (and replicas) to reach
    /// it on, such as a fault proxy's in front of it; empty: its own.
    pub announce: Vec<u16>,
    /// More `redis-server` arguments for every node.
    pub extra: Vec<String>,
}

/// A Redis Cluster on loopback, its nodes child processes of the test.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    announce: Vec<u16>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them; returns once
    /// every node reports `cluster_state:ok`.
    pub fn start() -> Result<Self, ServerError> {
        Self::start_with(ClusterSpec::default())
    }

    /// Starts the Cluster `spec` describes.
    pub fn start_with(spec: ClusterSpec) -> Result<Self, ServerError> {
        let count = MASTERS * (1 + spec.replicas);
        let ports = if spec.ports.is_empty() {
            Self::free_ports(count)?
        } else {
            spec.ports.clone()
        };
        let announce = if spec.announce.is_empty() {
            ports.clone()
        } else {
            spec.announce.clone()
        };
        if ports.len() != count || announce.len() != count || spec.replicas > 1 {
            return Err(failed(format!(
                "a Cluster of {MASTERS} masters with {} replicas each has {count} nodes: \
                 {} ports and {} announced given",
                spec.replicas,
                ports.len(),
                announce.len()
            )));
        }
        let mut nodes = Vec::new();
        for (port, announced) in ports.iter().zip(&announce) {
            let (announced, bus) = (announced.to_string(), (port + 10_000).to_string());
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                // A replica syncs at once rather than after 5 s.
                "--repl-diskless-sync-delay",
                "0",
                "--cluster-announce-port",
                &announced,
                "--cluster-announce-bus-port",
                &bus,
            ];
            args.extend(spec.extra.iter().map(String::as_str));
            nodes.push(RedisServer::start_with(*port, &args)?);
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &spec.replicas.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
        if !out.status.success() {
            return Err(failed(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let cluster = Self { nodes, announce };
        cluster.wait_until_ok()?;
        Ok(cluster)
    }

    /// `count` consecutive free loopback ports whose cluster-bus twins
    /// (+10000) are free as well, all reserved for this process.
    pub fn free_ports(count: usize) -> Result<Vec<u16>, ServerError> {
        let count = u16::try_from(count).map_err(|_| failed("too many ports"))?;
        free_run(count, Some(10_000))
    }

    /// Waits until every running node reports `cluster_state:ok`, every
    /// replica is in sync with its master (on both sides), and the Cluster passes
    /// `redis-cli --cluster check`.
    pub fn wait_until_ok(&self) -> Result<(), ServerError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.is_ok()? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(failed("the cluster did not reach cluster_state:ok in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn is_ok(&self) -> Result<bool, ServerError> {
        for node in self.running() {
            if !node.cli("CLUSTER INFO")?.contains("cluster_state:ok") {
                return Ok(false);
            }
            if !node.in_sync()? {
                return Ok(false);
            }
        }
        let Some(first) = self.running().next() else {
            return Ok(false);
        };
        if self
            .announce
            .iter()
            .zip(&self.nodes)
            .any(|(a, n)| *a != n.port())
        {
            // redis-cli would go through the announced ports (proxies that
            // may be faulty): check the slots from the nodes themselves.
            let info = first.cli("CLUSTER INFO")?;
            return Ok(info.contains("cluster_slots_ok:16384") && self.no_open_slots()?);
        }
        let check = Command::new("redis-cli")
            .args(["--cluster", "check", &format!("127.0.0.1:{}", first.port())])
            .stdin(Stdio::null())
            .output()
            .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
        Ok(check.status.success())
    }

    /// Whether no master has a slot half-moved (`MIGRATING`/`IMPORTING`).
    fn no_open_slots(&self) -> Result<bool, ServerError> {
        for node in self.running() {
            let nodes = node.cli("CLUSTER NODES")?;
            if nodes.contains("->-") || nodes.contains("-<-") {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    /// `redis+cluster://127.0.0.1:P1,…` with every node's announced port.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .announce
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
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

    /// The running nodes that are masters now, by index.
    pub fn masters(&self) -> Result<Vec<usize>, ServerError> {
        let mut masters = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if node.is_running() && node.cli("ROLE")?.starts_with("master") {
                masters.push(i);
            }
        }
        Ok(masters)
    }

    /// The running node replicating master `master`, if any.
    pub fn replica_of(&self, master: usize) -> Result<Option<usize>, ServerError> {
        let port = self.announce[master].to_string();
        for (i, node) in self.nodes.iter().enumerate() {
            if i == master || !node.is_running() {
                continue;
            }
            let role = node.cli("ROLE")?;
            let mut lines = role.lines();
            if lines.next() == Some("slave") && lines.nth(1) == Some(port.as_str()) {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Kills master `master` (SIGKILL) and promotes its replica at once
    /// (`CLUSTER FAILOVER FORCE`, asked again every 5 s: an election that
    /// misses its window under load ends the manual failover after 5 s);
    /// returns the promoted node's index once the Cluster is serving every
    /// slot again. Writes the dead master acknowledged and had not yet sent to
    /// the replica are gone.
    pub fn fail_over(&mut self, master: usize) -> Result<usize, ServerError> {
        let replica = self
            .replica_of(master)?
            .ok_or_else(|| failed(format!("node {master} has no replica to promote")))?;
        self.nodes[master].stop();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut asked: Option<Instant> = None;
        while !self.nodes[replica].cli("ROLE")?.starts_with("master") {
            if Instant::now() > deadline {
                return Err(failed(format!("node {replica} was not promoted in 30 s")));
            }
            if asked.is_none_or(|at| at.elapsed() > Duration::from_secs(5)) {
                self.nodes[replica].cli("CLUSTER FAILOVER FORCE")?;
                asked = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.running().all(|n| {
            n.cli("CLUSTER INFO")
                .is_ok_and(|i| i.contains("cluster_state:ok"))
        }) {
            if Instant::now() > deadline {
                return Err(failed("the Cluster did not serve every slot in 20 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(replica)
    }

    /// Replaces dead node `node` with a new, empty one on the same port
    /// that joins as the replica of `master`, and makes the other nodes
    /// forget the dead one; returns once the replica is in sync.
    pub fn replace(&mut self, node: usize, master: usize) -> Result<(), ServerError> {
        let ids = self.node_ids_running()?;
        let dead = ids
            .iter()
            .find_map(|(i, _)| {
                let nodes = self.nodes[*i].cli("CLUSTER NODES").ok()?;
                nodes
                    .lines()
                    .find(|l| l.contains(&format!(":{}@", self.announce[node])))
                    .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            })
            .ok_or_else(|| failed(format!("no node knows node {node}")))?;
        self.nodes[node].wipe()?;
        self.nodes[node].start_again()?;
        let master_id = self.nodes[master].cli("CLUSTER MYID")?.trim().to_owned();
        for (i, _) in &ids {
            // A node that already forgot it (or never knew it) says so.
            let _ = self.nodes[*i].cli(&format!("CLUSTER FORGET {dead}"));
        }
        let port = self.nodes[master].port();
        self.nodes[node].cli(&format!("CLUSTER MEET 127.0.0.1 {port}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // REPLICATE needs the master known first (gossip takes a beat).
            let done = self.nodes[node]
                .cli(&format!("CLUSTER REPLICATE {master_id}"))
                .is_ok_and(|out| out.trim() == "OK");
            if done {
                break;
            }
            if Instant::now() > deadline {
                return Err(failed(format!("node {node} could not replicate {master}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.nodes[node].in_sync()? {
            if Instant::now() > deadline {
                return Err(failed(format!("node {node} did not sync in 30 s")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_until_ok()
    }

    fn node_ids_running(&self) -> Result<Vec<(usize, String)>, ServerError> {
        let mut ids = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if node.is_running() {
                ids.push((i, node.cli("CLUSTER MYID")?.trim().to_owned()));
            }
        }
        Ok(ids)
    }

    /// Moves `slots` slots from node `from` to node `to` (both masters)
    /// with `redis-cli --cluster reshard` (MIGRATE under live traffic:
    /// clients meet ASK and then MOVED redirections).
    pub fn reshard(&self, from: usize, to: usize, slots: u32) -> Result<(), ServerError> {
        let ids = self.node_ids_running()?;
        let id = |node: usize| {
            ids.iter()
                .find(|(i, _)| *i == node)
                .map(|(_, id)| id.clone())
                .ok_or_else(|| failed(format!("node {node} is not running")))
        };
        let out = Command::new("redis-cli")
            .args(["--cluster", "reshard"])
            .arg(format!("127.0.0.1:{}", self.nodes[to].port()))
            .args(["--cluster-from", &id(from)?, "--cluster-to", &id(to)?])
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

    /// Moves `count` of master `from`'s slots, with their keys, to master
    /// `to`, slot by slot as `redis-cli --cluster reshard` does (clients
    /// meet ASK, then MOVED), but talking to the nodes on their own ports
    /// only, so faults at announced ports do not break the move. Before a
    /// slot is handed over, `to`'s replica has its keys: a failover of
    /// `to` right after the move loses nothing the move carried. Returns
    /// how many keys moved.
    pub fn move_slots(&self, from: usize, to: usize, count: usize) -> Result<usize, ServerError> {
        let (from_id, to_id) = (
            self.cli(from, "CLUSTER MYID")?.trim().to_owned(),
            self.cli(to, "CLUSTER MYID")?.trim().to_owned(),
        );
        let slots = owned_slots(&self.cli(from, "CLUSTER NODES")?, &from_id);
        let to_port = self.nodes[to].port().to_string();
        let mut moved = 0;
        for slot in slots.into_iter().take(count) {
            let slot = slot.to_string();
            self.on(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id])?;
            self.on(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id])?;
            loop {
                let keys = self.on(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"])?;
                let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
                if keys.is_empty() {
                    break;
                }
                let mut migrate = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
                migrate.extend(&keys);
                self.on(from, &migrate)?;
                moved += keys.len();
            }
            self.wait_replicated(to)?;
            self.on(to, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])?;
            self.on(from, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])?;
            for node in self.masters()? {
                if node != from && node != to {
                    self.on(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])?;
                }
            }
        }
        Ok(moved)
    }

    /// Waits until master `master` has a replica attached and every
    /// replica has what the master has written so far. A master whose
    /// replica link is down (a fault at the proxy, a resync) lists no
    /// replica at all: that is waited out, not taken as "all caught up",
    /// or keys a move just carried there could die with the master.
    fn wait_replicated(&self, master: usize) -> Result<(), ServerError> {
        let field = |info: &str, name: &str| -> Vec<u64> {
            info.lines()
                .filter_map(|l| l.strip_prefix(name))
                .filter_map(|v| {
                    v.split(',')
                        .find_map(|kv| kv.strip_prefix("offset="))
                        .or(Some(v.trim()))
                        .and_then(|n| n.trim().parse().ok())
                })
                .collect()
        };
        let info = self.cli(master, "INFO replication")?;
        let target = field(&info, "master_repl_offset:")
            .first()
            .copied()
            .unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info = self.cli(master, "INFO replication")?;
            let offsets: Vec<u64> = (0..4)
                .flat_map(|i| field(&info, &format!("slave{i}:")))
                .collect();
            if !offsets.is_empty() && offsets.iter().all(|o| *o >= target) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "node {master}'s replica did not catch up in 20 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `args` on node `node` with `redis-cli`, word for word.
    fn on(&self, node: usize, args: &[&str]) -> Result<String, ServerError> {
        run_cli(self.nodes[node].port(), args)
    }

    /// Sends one command to node `node` with `redis-cli`.
    pub fn cli(&self, node: usize, command: &str) -> Result<String, ServerError> {
        cli(self.nodes[node].port(), command)
    }
}

/// The slots `id` owns, from a `CLUSTER NODES` listing.
fn owned_slots(nodes: &str, id: &str) -> Vec<u16> {
    let Some(line) = nodes.lines().find(|l| l.starts_with(id)) else {
        return Vec::new();
    };
    let mut slots = Vec::new();
    for range in line.split_whitespace().skip(8) {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        if let (Ok(first), Ok(last)) = (first.parse::<u16>(), last.parse::<u16>()) {
            slots.extend(first..=last);
        }
    }
    slots
}

/// Runs `redis-cli` on `port` with `args` as they are (keys may hold
/// any character) and returns its output; a Redis error is an error.
fn run_cli(port: u16, args: &[&str]) -> Result<String, ServerError> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() && !text.starts_with("ERR") && !text.starts_with("(error)") {
        Ok(text)
    } else {
        Err(failed(format!(
            "redis-cli -p {port} {}: {text}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
