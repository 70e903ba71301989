//! A Redis Cluster on loopback: three masters, optionally a replica each,
//! optionally announcing other ports to clients (fault proxies in front of
//! the nodes), with the faults a Cluster meets: a master killed and its
//! replica promoted, the dead node replaced, slots migrated.

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis::{cli, RedisServer};
use crate::server::failed;
use crate::server::ServerError;

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

    /// `count` free loopback ports below 55535 whose cluster-bus twins
    /// (+10000) are free as well, consecutive.
    pub fn free_ports(count: usize) -> Result<Vec<u16>, ServerError> {
        let count = u16::try_from(count).map_err(|_| failed("too many ports"))?;
        for _ in 0..200 {
            let base = 20_000 + rand::random::<u16>() % 30_000;
            let free = (base..base + count).all(|p| {
                TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok()
                    && TcpListener::bind((Ipv4Addr::LOCALHOST, p + 10_000)).is_ok()
            });
            if free {
                return Ok((base..base + count).collect());
            }
        }
        Err(failed(format!("no {count} free consecutive ports found")))
    }

    /// Waits until every running node reports `cluster_state:ok`, every
    /// replica is in sync with its master, and the Cluster passes
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
            let replication = node.cli("INFO replication")?;
            if replication.contains("role:slave")
                && !replication.contains("master_link_status:up")
            {
                return Ok(false);
            }
        }
        let Some(first) = self.running().next() else {
            return Ok(false);
        };
        let check = Command::new("redis-cli")
            .args(["--cluster", "check", &format!("127.0.0.1:{}", first.port())])
            .stdin(Stdio::null())
            .output()
            .map_err(|_| ServerError::NotInstalled("redis-cli"))?;
        Ok(check.status.success())
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
    /// (`CLUSTER FAILOVER FORCE`: no waiting for the node timeout);
    /// returns the promoted node's index once the Cluster is serving
    /// every slot again. Writes the dead master acknowledged and had not
    /// yet sent to the replica are gone.
    pub fn fail_over(&mut self, master: usize) -> Result<usize, ServerError> {
        let replica = self
            .replica_of(master)?
            .ok_or_else(|| failed(format!("node {master} has no replica to promote")))?;
        self.nodes[master].stop();
        self.nodes[replica].cli("CLUSTER FAILOVER FORCE")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.nodes[replica].cli("ROLE")?.starts_with("master") {
            if Instant::now() > deadline {
                return Err(failed(format!("node {replica} was not promoted in 20 s")));
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
        while !self.nodes[node]
            .cli("INFO replication")?
            .contains("master_link_status:up")
        {
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

    /// Sends one command to node `node` with `redis-cli`.
    pub fn cli(&self, node: usize, command: &str) -> Result<String, ServerError> {
        cli(self.nodes[node].port(), command)
    }
}
