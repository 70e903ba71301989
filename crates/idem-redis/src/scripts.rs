//! The Lua scripts (`lua/*.lua`), one per primitive, each prefixed with
//! `lua/prelude.lua`, and how they are called: `EVALSHA`, falling back to
//! `EVAL` (which also caches the script) when a server does not know the
//! script yet — after a restart, a failover, or on a Cluster node that
//! just received a slot.
//!
//! The five primitives of the store contract (`claim`, `complete`, `fail`,
//! `extend`, `release`) are each a Lua function in its own file. A
//! primitive's script calls its function once; the batch script
//! (`lua/batch.lua`) holds all five and calls them for many records in
//! one go. Both run the same function, so a rule lives in one place.

use redis::{Cmd, RedisResult, ServerErrorKind, Value};

use crate::call::Op;
use crate::conn::{Conn, Server};

/// One script: its full text and SHA-1.
#[derive(Debug)]
pub(crate) struct Script {
    body: String,
    sha: String,
    /// Whether it touches the record's pending mark (`lua/pending.lua`),
    /// declared beside the record in every call.
    marks: bool,
}

macro_rules! lua {
    ($file:literal) => {
        include_str!(concat!("../lua/", $file))
    };
}

macro_rules! script {
    ($file:literal) => {
        Script::new(lua!($file))
    };
}

/// A primitive's Lua function: its name, and the files that define it
/// (and the functions it calls), in order.
fn function(op: Op) -> (&'static str, &'static [&'static str]) {
    const PENDING: &[&str] = &[lua!("complete.lua"), lua!("pending.lua")];
    match op {
        Op::Claim => ("claim", &[lua!("claim.lua")]),
        Op::Complete => ("complete", &[lua!("complete.lua")]),
        Op::Fail => ("fail", &[lua!("fail.lua")]),
        Op::Extend => ("extend", &[lua!("extend.lua")]),
        Op::Release => ("release", &[lua!("release.lua")]),
        Op::CompletePending => ("complete_pending", PENDING),
        Op::Confirm => ("confirm", PENDING),
    }
}

/// The script of one primitive: its function, called once with the
/// script's key and arguments.
fn primitive(op: Op) -> Script {
    let (name, files) = function(op);
    let mut script = Script::new(&format!(
        "{}\nreturn {name}(KEYS[1], unpack(ARGV))\n",
        files.join("\n")
    ));
    script.marks = op.marks();
    script
}

/// The batch script: every primitive's function, and the loop that calls
/// them for each record of a batch.
pub(crate) fn batch() -> Script {
    let mut files: Vec<&str> = Vec::new();
    for file in Op::ALL.iter().flat_map(|&op| function(op).1) {
        if !files.contains(file) {
            files.push(file);
        }
    }
    Script::new(&format!("{}\n{}", files.join("\n"), lua!("batch.lua")))
}

/// The claim and completion functions as the scripts define them (the
/// prelude, `lua/claim.lua`, `lua/complete.lua`), with nothing calling
/// them: the pairs bench appends a loop of its own and runs it as one
/// `EVAL`, to measure what a pair costs inside Redis without the network
/// or a batch around it.
pub fn pair_functions() -> String {
    let files: Vec<&str> = [Op::Claim, Op::Complete]
        .iter()
        .flat_map(|&op| function(op).1.iter().copied())
        .collect();
    format!(
        "{}\n{}\n",
        include_str!("../lua/prelude.lua"),
        files.join("\n")
    )
}

/// The step journal of the record `key` (`lua/prelude.lua`), in the
/// record's slot by its hash tag. A script that touches it declares it
/// beside the record, so a Cluster moving the slot answers `TRYAGAIN`
/// while the two are on different nodes, rather than running the script
/// on one of them.
fn journal_key(key: &str) -> String {
    format!("{key}:j")
}

/// The memory of the record `key` past its retention (`lua/prelude.lua`),
/// in the record's slot by its hash tag, declared beside the record as the
/// journal is.
fn memory_key(key: &str) -> String {
    format!("{key}:h")
}

/// The record `key`'s mark in the outbox's pending index
/// (`lua/pending.lua`), in the record's slot by its hash tag, declared
/// beside the record by the scripts that touch it.
pub(crate) fn pending_key(key: &str) -> String {
    format!("{key}:o")
}

/// Whether a script stopped, before any write, because it needs the
/// record's journal declared (`JOURNAL`, see `lua/prelude.lua`).
fn needs_journal(error: &redis::RedisError) -> bool {
    error.code() == Some("JOURNAL")
}

impl Script {
    fn new(source: &str) -> Self {
        let body = format!("{}\n{source}", include_str!("../lua/prelude.lua"));
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Self {
            body,
            sha,
            marks: false,
        }
    }

    /// The same script, declaring the record's pending mark in every call.
    fn marking(mut self) -> Self {
        self.marks = true;
        self
    }

    /// The `EVALSHA` command for the record `key` (its journal and memory
    /// declared) with `args`, for a pipeline to a single server.
    pub(crate) fn evalsha(&self, key: &str, args: &[&[u8]]) -> Cmd {
        let (journal, memory, mark) = (journal_key(key), memory_key(key), pending_key(key));
        let all = [key, &journal, &memory, &mark];
        self.command("EVALSHA", &self.sha, &all[..self.declared(3)], args)
    }

    /// How many of `n` keys, the record's and its companions', a call
    /// declares: with the pending mark after them when the script touches
    /// it.
    fn declared(&self, n: usize) -> usize {
        n + usize::from(self.marks)
    }

    fn command(&self, name: &str, script: &str, keys: &[&str], args: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script).arg(keys.len()).arg(keys);
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }

    /// Runs the script on `key`'s server. A single server gets the
    /// record's journal and memory declared every time. A Cluster gets the
    /// memory declared when `remembering` (the store remembers expired
    /// keys), and the journal only when the script asks for it (the record
    /// has a journal): a record with neither stays one key, which a slot
    /// on the move serves by `ASK`.
    pub(crate) async fn run(
        &self,
        conn: &Conn,
        key: &str,
        args: &[&[u8]],
        remembering: bool,
    ) -> RedisResult<Value> {
        let (journal, memory, mark) = (journal_key(key), memory_key(key), pending_key(key));
        let all = [key, memory.as_str(), journal.as_str()];
        let mut first: Vec<&str> = match conn {
            Conn::Cluster(_) if remembering => all[..2].to_vec(),
            Conn::Cluster(_) => all[..1].to_vec(),
            Conn::Standalone(_) => all.to_vec(),
        };
        if self.marks {
            first.push(&mark);
        }
        match self.run_keys(conn, key, &first, args).await {
            Err(e) if needs_journal(&e) => {
                first.push(all[2]);
                self.run_keys(conn, key, &first, args).await
            }
            other => other,
        }
    }

    /// Runs the script with `keys` on the server of `key` (the first).
    async fn run_keys(
        &self,
        conn: &Conn,
        key: &str,
        keys: &[&str],
        args: &[&[u8]],
    ) -> RedisResult<Value> {
        let evalsha = self.command("EVALSHA", &self.sha, keys, args);
        match conn.query_key(&evalsha, key).await {
            Err(e) if is_noscript(&e) => {
                let eval = self.command("EVAL", &self.body, keys, args);
                conn.query_key(&eval, key).await
            }
            other => other,
        }
    }

    /// Runs the script on `key` on one server.
    pub(crate) async fn run_on(
        &self,
        server: &Server,
        key: &str,
        args: &[&[u8]],
    ) -> RedisResult<Value> {
        let (journal, memory, mark) = (journal_key(key), memory_key(key), pending_key(key));
        let all = [key, &journal, &memory, &mark];
        self.run_many(server, &all[..self.declared(3)], args).await
    }

    /// Runs the script with many `keys` on one server.
    pub(crate) async fn run_many(
        &self,
        server: &Server,
        keys: &[&str],
        args: &[&[u8]],
    ) -> RedisResult<Value> {
        let evalsha = self.command("EVALSHA", &self.sha, keys, args);
        match server.query(&evalsha).await {
            Err(e) if is_noscript(&e) => {
                server
                    .query(&self.command("EVAL", &self.body, keys, args))
                    .await
            }
            other => other,
        }
    }

    /// Loads the script into the server `conn` reaches (a pipeline that
    /// met `NOSCRIPT` loads it, then runs again).
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.body);
        cmd
    }
}

pub(crate) fn is_noscript(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Every script the store runs.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) complete: Script,
    pub(crate) fail: Script,
    pub(crate) extend: Script,
    pub(crate) release: Script,
    pub(crate) complete_pending: Script,
    pub(crate) confirm: Script,
    pub(crate) pending_take: Script,
    pub(crate) get: Script,
    pub(crate) delete: Script,
    pub(crate) purge: Script,
    pub(crate) step_begin: Script,
    pub(crate) step_finish: Script,
    pub(crate) steps: Script,
    pub(crate) resolve: Script,
    pub(crate) watch: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            claim: primitive(Op::Claim),
            complete: primitive(Op::Complete),
            fail: primitive(Op::Fail),
            extend: primitive(Op::Extend),
            release: primitive(Op::Release),
            complete_pending: primitive(Op::CompletePending),
            confirm: primitive(Op::Confirm),
            pending_take: script!("pending_take.lua").marking(),
            get: script!("get.lua"),
            delete: script!("delete.lua"),
            purge: script!("purge.lua"),
            step_begin: script!("step_begin.lua"),
            step_finish: script!("step_finish.lua"),
            steps: script!("steps.lua"),
            resolve: script!("resolve.lua"),
            watch: script!("watch.lua"),
        }
    }

    /// Every script, for loading them all.
    pub(crate) fn all(&self) -> [&Script; 16] {
        [
            &self.claim,
            &self.complete,
            &self.fail,
            &self.extend,
            &self.release,
            &self.complete_pending,
            &self.confirm,
            &self.pending_take,
            &self.get,
            &self.delete,
            &self.purge,
            &self.step_begin,
            &self.step_finish,
            &self.steps,
            &self.resolve,
            &self.watch,
        ]
    }

    /// The script of `op`, as its own call.
    pub(crate) fn primitive(&self, op: Op) -> &Script {
        match op {
            Op::Claim => &self.claim,
            Op::Complete => &self.complete,
            Op::Fail => &self.fail,
            Op::Extend => &self.extend,
            Op::Release => &self.release,
            Op::CompletePending => &self.complete_pending,
            Op::Confirm => &self.confirm,
        }
    }

    /// The SHA-1 of the claim script, for `redis-benchmark EVALSHA`.
    pub(crate) fn claim_sha(&self) -> &str {
        &self.claim.sha
    }
}
