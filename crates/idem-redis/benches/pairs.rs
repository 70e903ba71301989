//! Claim+complete pairs per second through `RedisStore`, next to the
//! server's own limit for the same work measured in the same run:
//! `redis-benchmark` calling the claim script with `EVALSHA` at the same
//! client count. A pair is two script calls, so the ceiling is half the
//! `redis-benchmark` rate; the ratio column is pairs/s over that ceiling.
//! On one server the pairs run twice: as the store runs them by default
//! (calls made at the same time share a batch script call) and with
//! batching turned off (one script call each, as on a Cluster). Each
//! says what the client (this process) and the Redis server (`INFO cpu`)
//! spent per pair.
//! Batched claims (`claim_many`, 100 per call) are compared with single
//! claims, and with `redis-benchmark -P 100` (the same script, pipelined).
//! On one server, what a pair costs inside Redis without the network: one
//! `EVAL` running the store's claim and completion functions over fresh
//! keys in a loop, beside the same loop making only the pair's two writes.
//! Last, a store that remembers expired keys for 30 days against one that
//! does not, over `--rounds` rounds (order alternated, the first round
//! not reported): pairs per second, Redis CPU per pair, and the Redis
//! memory each remembered key adds (`INFO memory`).
//!
//! Run: `cargo bench -p idem-redis --bench pairs [-- --cluster] [-- --secs N] [-- --rounds N]`
//!
//! It starts its own `redis-server` (or 3-master Cluster) on free loopback
//! ports, so nothing else competes for the server.

#![allow(clippy::print_stdout)] // a benchmark reports on stdout

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use idem::store::ClaimParams;
use idem::{ClaimMany, RecordId, Store};
use idem_redis::RedisStore;
use idem_testkit::bench::{count_arg, pair, rate, secs_arg, CpuMeter};
use idem_testkit::servers::redis::{RedisCluster, RedisServer};

const CALLERS: [usize; 3] = [1, 16, 64];
const BATCH: usize = 100;

enum Servers {
    One(RedisServer),
    Cluster(RedisCluster),
}

impl Servers {
    fn url(&self) -> String {
        match self {
            Servers::One(s) => s.url(),
            Servers::Cluster(c) => c.url(),
        }
    }

    fn port(&self) -> u16 {
        match self {
            Servers::One(s) => s.port(),
            Servers::Cluster(c) => c.nodes()[0].port(),
        }
    }

    fn nodes(&self) -> Vec<&RedisServer> {
        match self {
            Servers::One(s) => vec![s],
            Servers::Cluster(c) => c.nodes().iter().collect(),
        }
    }

    /// CPU time the server processes have used so far (`INFO cpu`).
    fn cpu(&self) -> Duration {
        self.nodes()
            .iter()
            .map(|n| n.cpu().expect("INFO cpu"))
            .sum()
    }

    /// Script calls so far, and the microseconds Redis spent inside them
    /// (`INFO commandstats`: `EVALSHA` and `EVAL`, with the commands the
    /// scripts call).
    fn scripts(&self) -> (f64, f64) {
        let mut calls = 0.0;
        let mut usec = 0.0;
        for node in self.nodes() {
            for command in ["evalsha", "eval"] {
                let stats = node.command_stats(command).expect("INFO commandstats");
                calls += stats.calls as f64;
                usec += stats.usec as f64;
            }
        }
        (calls, usec)
    }

    /// The memory the servers use now, in bytes (`INFO memory`).
    fn used_memory(&self) -> f64 {
        self.nodes()
            .iter()
            .map(|n| {
                let info = n.cli("INFO memory").expect("INFO memory");
                info.lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .expect("used_memory")
            })
            .sum()
    }

    fn flush(&self) {
        for node in self.nodes() {
            node.cli("FLUSHALL").expect("flush");
        }
    }
}

fn params() -> ClaimParams {
    ClaimParams::new(Duration::from_secs(30), Duration::from_secs(3600))
}

/// `redis-benchmark` calling the claim script on fresh random keys:
/// requests per second.
fn redis_benchmark(
    servers: &Servers,
    sha: &str,
    clients: usize,
    pipeline: usize,
    secs: f64,
) -> f64 {
    // Aim for about `secs` of work at a rough first guess of the rate.
    let requests = ((secs * 40_000.0) as usize).max(20_000) * pipeline.min(4);
    let token = "0".repeat(32);
    let claim = [
        "EVALSHA", sha, "1", KEY, &token, "", "30000", "3600000", "bench", "k", "60000", "0",
    ];
    redis_benchmark_run(servers, clients, pipeline, requests, 100_000_000, &claim)
}

/// The key `redis-benchmark` fills in: `__rand_int__` is replaced by a
/// random number; in cluster mode it routes by the `{tag}` it fills in
/// per node.
const KEY: &str = "bench:{__rand_int__}";

/// `redis-benchmark` sending `command` `requests` times, with keys drawn
/// from `keyspace`: requests per second.
fn redis_benchmark_run(
    servers: &Servers,
    clients: usize,
    pipeline: usize,
    requests: usize,
    keyspace: usize,
    command: &[&str],
) -> f64 {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &servers.port().to_string()])
        .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
        .args(["-P", &pipeline.to_string(), "-r", &keyspace.to_string()])
        .args(["--csv", "-q"]);
    let cluster = matches!(servers, Servers::Cluster(_));
    if cluster {
        cmd.arg("--cluster");
    }
    for arg in command {
        match *arg {
            KEY if cluster => cmd.arg("bench:{tag}:__rand_int__"),
            other => cmd.arg(other),
        };
    }
    let out = cmd
        .output()
        .expect("run redis-benchmark (apt-get install redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // CSV: "test","rps",...; the last line holds the numbers.
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with(&format!("\"{}", command[0])))
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"));
    line.split(',')
        .nth(1)
        .and_then(|rps| rps.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("no rate in {line}"))
}

/// The least a pair can cost the server: Redis CPU in microseconds per
/// plain `SET key value PX ms` (no script) of a fresh key and of a key
/// that exists, from `redis-benchmark` with 64 clients pipelining 64.
/// A pair writes its record twice: once new (the claim), once over
/// itself (the completion, which also reads it first).
fn write_floor(servers: &Servers) -> (f64, f64) {
    let requests = 500_000;
    let value = "x".repeat(120);
    let set = ["SET", KEY, &value, "PX", "3600000"];
    let per_set = |keyspace: usize| {
        servers.flush();
        if keyspace < requests {
            redis_benchmark_run(servers, 64, 64, keyspace * 4, keyspace, &set);
        }
        let before = servers.cpu();
        redis_benchmark_run(servers, 64, 64, requests, keyspace, &set);
        servers.cpu().saturating_sub(before).as_secs_f64() * 1e6 / requests as f64
    };
    (per_set(1_000_000_000), per_set(10_000))
}

/// Fresh keys per round of [`in_one_call`].
const IN_ONE_CALL: usize = 20_000;

/// The loop [`in_one_call`] appends to the store's claim and completion
/// functions: `ARGV[1]` pairs on fresh keys (`ARGV[2]` tells rounds apart),
/// each claimed and completed as the batch script would, with a record's
/// usual sizes (a 32-digit token, a 64-digit fingerprint, 120 bytes of
/// response).
const PAIRS_LOOP: &str = r#"
all_declared = true
local response = string.rep('r', 120)
local fp = string.rep('ab', 32)
for i = 1, tonumber(ARGV[1]) do
  local key = 'loop:' .. ARGV[2] .. ':' .. i
  local token = string.format('%032x', i)
  local a = claim(key, token, fp, '30000', '3600000', 'bench', 'order-' .. i, '1000', '0')
  if a[1] ~= 'A' or complete(key, token, response, '3600000', '1000', '0') ~= 1 then
    return redis.error_reply('pair ' .. i .. ' did not run')
  end
end
return 0
"#;

/// The same loop with the pair's two writes alone, each a `SET … PXAT` of
/// the record's size then (185 bytes claimed, 305 completed), and the
/// loop's own work (the key, the token, the name).
const SETS_LOOP: &str = r#"
local tm = redis.call('TIME')
local until_ms = string.format('%d', tonumber(tm[1]) * 1000 + 3601000)
local claimed, completed = string.rep('m', 185), string.rep('m', 305)
for i = 1, tonumber(ARGV[1]) do
  local key = 'loop:' .. ARGV[2] .. ':' .. i
  local token = string.format('%032x', i)
  local name = 'order-' .. i
  redis.call('SET', key, claimed, 'PXAT', until_ms)
  redis.call('SET', key, completed, 'PXAT', until_ms)
end
return 0
"#;

/// What a pair costs inside Redis with no network and no batch around it:
/// microseconds per pair of one `EVAL` running the store's own claim and
/// completion functions over fresh keys, against the same loop making
/// only the pair's two writes. `rounds` rounds, the two loops in
/// alternating order; the first round is not reported.
async fn in_one_call(servers: &Servers, rounds: usize) {
    let client = redis::Client::open(servers.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let pairs = format!("{}{PAIRS_LOOP}", idem_redis::pair_functions());
    let mut run = async |script: &str, tag: String| {
        servers.flush();
        let (_, before) = servers.scripts();
        let _: i64 = redis::cmd("EVAL")
            .arg(script)
            .arg(0)
            .arg(IN_ONE_CALL)
            .arg(tag)
            .query_async(&mut conn)
            .await
            .expect("the loop runs");
        (servers.scripts().1 - before) / IN_ONE_CALL as f64
    };
    println!(
        "\n| round | us a pair inside one EVAL, the store's functions | two plain SETs from Lua | ratio |"
    );
    println!("|---:|---:|---:|---:|");
    for round in 0..=rounds {
        let (pair, sets) = if round % 2 == 0 {
            let pair = run(&pairs, format!("p{round}")).await;
            (pair, run(SETS_LOOP, format!("s{round}")).await)
        } else {
            let sets = run(SETS_LOOP, format!("s{round}")).await;
            (run(&pairs, format!("p{round}")).await, sets)
        };
        if round > 0 {
            println!("| {round} | {pair:.2} | {sets:.2} | {:.2} |", pair / sets);
        }
    }
}

/// What a run of pairs measured: pairs per second; CPU per pair in
/// microseconds of this process (the client) and of the servers; and per
/// pair, the script calls and the microseconds spent inside scripts.
struct Pairs {
    per_second: f64,
    client: f64,
    server: f64,
    scripts: f64,
    in_scripts: f64,
}

/// Claim+complete pairs on fresh keys, `callers` at a time.
async fn pairs_of(servers: &Servers, store: RedisStore, callers: usize, secs: f64) -> Pairs {
    let (calls_before, usec_before) = servers.scripts();
    let before = servers.cpu();
    let meter = CpuMeter::start();
    let per_second = rate(callers, secs, move |c, i| {
        let s = store.clone();
        async move {
            let id = RecordId::parse("bench", &format!("p{c}-{i}")).expect("valid");
            let response = Bytes::from_static(b"{\"ok\":true}");
            pair(&s, &id, &params(), response, Duration::from_secs(3600)).await;
            1
        }
    })
    .await;
    let used = meter.stop();
    let pairs = per_second * used.wall.as_secs_f64();
    let server = servers.cpu().saturating_sub(before);
    let (calls, usec) = servers.scripts();
    let micros = |d: Duration| d.as_secs_f64() * 1e6 / pairs;
    Pairs {
        per_second,
        client: micros(used.process),
        server: micros(server),
        scripts: (calls - calls_before) / pairs,
        in_scripts: (usec - usec_before) / pairs,
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cluster = args.iter().any(|a| a == "--cluster");
    let secs = secs_arg(3.0);
    let servers = if cluster {
        Servers::Cluster(RedisCluster::start().expect("start a Redis Cluster"))
    } else {
        Servers::One(RedisServer::start().expect("start redis-server"))
    };
    let store = RedisStore::connect(&servers.url()).await.expect("connect");
    let unbatched = RedisStore::builder(&servers.url())
        .expect("url")
        .batching(false)
        .connect()
        .await
        .expect("connect");
    store.load_scripts().await.expect("load scripts");
    let sha = store.claim_script_sha().to_owned();
    let what = if cluster {
        "3-master Cluster"
    } else {
        "one server"
    };
    println!("# idem-redis pairs, {what}, {secs} s per point\n");
    println!(
        "| callers | idem pairs/s | batching off | redis-benchmark EVALSHA claims/s \
         | ceiling pairs/s | ratio | ratio, batching off | CPU us/pair client / Redis \
         | batching off |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---|");
    let mut single_claims = Vec::new();
    let mut inside = Vec::new();
    for callers in CALLERS {
        servers.flush();
        let batched = pairs_of(&servers, store.clone(), callers, secs).await;
        let off = if cluster {
            // A Cluster runs one script call per primitive either way.
            None
        } else {
            servers.flush();
            Some(pairs_of(&servers, unbatched.clone(), callers, secs).await)
        };
        let off = off.as_ref().unwrap_or(&batched);
        let (pairs, client, server) = (batched.per_second, batched.client, batched.server);
        let (unbatched, unbatched_client, unbatched_server) =
            (off.per_second, off.client, off.server);
        inside.push((callers, batched.scripts, batched.in_scripts, off.in_scripts));
        servers.flush();
        let s = store.clone();
        let claims = rate(callers, secs, move |c, i| {
            let s = s.clone();
            async move {
                let id = RecordId::parse("bench", &format!("c{c}-{i}")).expect("valid");
                s.claim(&id, &params()).await.expect("claim");
                1
            }
        })
        .await;
        single_claims.push(claims);
        servers.flush();
        let ceiling = redis_benchmark(&servers, &sha, callers, 1, secs) / 2.0;
        println!(
            "| {callers} | {pairs:.0} | {unbatched:.0} | {:.0} | {ceiling:.0} | {:.2} | {:.2} \
             | {client:.0} / {server:.0} | {unbatched_client:.0} / {unbatched_server:.0} |",
            ceiling * 2.0,
            pairs / ceiling,
            unbatched / ceiling
        );
    }
    println!("\n| callers | script calls/pair | Redis us/pair inside scripts | batching off |");
    println!("|---:|---:|---:|---:|");
    for (callers, calls, usec, usec_off) in inside {
        println!("| {callers} | {calls:.2} | {usec:.1} | {usec_off:.1} |");
    }
    if !cluster {
        in_one_call(&servers, count_arg("--rounds", 3)).await;
    }
    let (fresh, again) = write_floor(&servers);
    println!(
        "\nThe floor, plain `SET key value PX ms` from redis-benchmark (64 clients, \
         pipelined 64, no script): {fresh:.2} us of Redis CPU per SET of a fresh key, \
         {again:.2} over an existing one; a pair writes twice: {:.2} us.",
        fresh + again
    );
    println!("\n| callers | single claims/s | claim_many({BATCH}) claims/s | batched/single | redis-benchmark -P {BATCH} claims/s | batched/ceiling |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (n, callers) in [1usize, 16].into_iter().enumerate() {
        servers.flush();
        let s = store.clone();
        let batched = rate(callers, secs, move |c, i| {
            let s = s.clone();
            async move {
                let claims: Vec<(RecordId, ClaimParams)> = (0..BATCH)
                    .map(|j| {
                        let id = RecordId::parse("bench", &format!("b{c}-{i}-{j}")).expect("valid");
                        (id, params())
                    })
                    .collect();
                let results = s.claim_many(&claims).await.expect("batch");
                results.iter().filter(|r| r.is_ok()).count() as u64
            }
        })
        .await;
        servers.flush();
        let ceiling = redis_benchmark(&servers, &sha, callers, BATCH, secs);
        let single = single_claims[n];
        println!(
            "| {callers} | {single:.0} | {batched:.0} | {:.1} | {ceiling:.0} | {:.2} |",
            batched / single,
            batched / ceiling
        );
    }
    remembering(&servers, secs, count_arg("--rounds", 3)).await;
}

/// One round of [`remembering`]: the remembering store's pairs and the
/// bytes each left, then the plain store's.
type Compared = (Pairs, f64, Pairs, f64);

/// A remembering store's pairs against a plain one's, same servers, order
/// alternated each round: pairs per second, Redis CPU per pair, and the
/// memory each pair leaves (its record, and for the remembering store the
/// record's memory too).
async fn remembering(servers: &Servers, secs: f64, rounds: usize) {
    let namespace = |name: &str| format!("{}?namespace={name}", servers.url());
    // Namespaces of one length, so that records cost the same.
    let remembering = RedisStore::builder(&namespace("idem-r"))
        .expect("url")
        .remember_expired(Duration::from_secs(30 * 86_400))
        .connect()
        .await
        .expect("connect");
    let plain = RedisStore::connect(&namespace("idem-p"))
        .await
        .expect("connect");
    println!(
        "\n| callers | pairs/s, remembering | pairs/s, not | remembering/not \
         | Redis us/pair, remembering | not | bytes/key, remembering | not |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for callers in [16, 64] {
        let mut rows: Vec<Compared> = Vec::new();
        for round in 0..=rounds {
            // A store keeps the memory it read at connect, so the flush
            // (which takes the namespace's setting too) does not turn it off.
            let run = |store: &RedisStore| {
                let store = store.clone();
                async move {
                    servers.flush();
                    let before = servers.used_memory();
                    let pairs = pairs_of(servers, store, callers, secs).await;
                    let bytes =
                        (servers.used_memory() - before) / (pairs.per_second * secs).max(1.0);
                    (pairs, bytes)
                }
            };
            let (r, n) = if round % 2 == 0 {
                let r = run(&remembering).await;
                (r, run(&plain).await)
            } else {
                let n = run(&plain).await;
                (run(&remembering).await, n)
            };
            if round > 0 {
                rows.push((r.0, r.1, n.0, n.1));
            }
        }
        let range = |f: &dyn Fn(&Compared) -> f64, digits: usize| {
            let values: Vec<f64> = rows.iter().map(f).collect();
            let (lo, hi) = values
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
            format!("{lo:.digits$}–{hi:.digits$}")
        };
        println!(
            "| {callers} | {} | {} | {} | {} | {} | {} | {} |",
            range(&|r| r.0.per_second, 0),
            range(&|r| r.2.per_second, 0),
            range(&|r| r.0.per_second / r.2.per_second, 2),
            range(&|r| r.0.server, 1),
            range(&|r| r.2.server, 1),
            range(&|r| r.1, 0),
            range(&|r| r.3, 0),
        );
    }
}
