//! The Lua scripts (`lua/*.lua`), one per primitive, each prefixed with
//! `lua/prelude.lua`, and how they are called: `EVALSHA`, falling back to
//! `EVAL` (which also caches the script) when a server does not know the
//! script yet — after a restart, a failover, or on a Cluster node that
//! just received a slot.

use redis::{Cmd, RedisResult, ServerErrorKind, Value};

use crate::conn::Conn;

/// One script: its full text and SHA-1.
#[derive(Debug)]
pub(crate) struct Script {
    body: String,
    sha: String,
}

macro_rules! script {
    ($file:literal) => {
        Script::new(include_str!(concat!("../lua/", $file)))
    };
}

impl Script {
    fn new(source: &str) -> Self {
        let body = format!("{}\n{source}", include_str!("../lua/prelude.lua"));
        let sha = redis::Script::new(&body).get_hash().to_owned();
        Self { body, sha }
    }

    /// The `EVALSHA` command for `key` with `args`.
    pub(crate) fn evalsha(&self, key: &str, args: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(1).arg(key);
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }

    fn eval(&self, key: &str, args: &[&[u8]]) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&self.body).arg(1).arg(key);
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }

    /// Runs the script on `key`'s server.
    pub(crate) async fn run(&self, conn: &Conn, key: &str, args: &[&[u8]]) -> RedisResult<Value> {
        match conn.query_key(&self.evalsha(key, args), key).await {
            Err(e) if is_noscript(&e) => conn.query_key(&self.eval(key, args), key).await,
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
    pub(crate) get: Script,
    pub(crate) delete: Script,
    pub(crate) purge: Script,
    pub(crate) step_begin: Script,
    pub(crate) step_finish: Script,
    pub(crate) steps: Script,
    pub(crate) resolve: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            claim: script!("claim.lua"),
            complete: script!("complete.lua"),
            fail: script!("fail.lua"),
            extend: script!("extend.lua"),
            release: script!("release.lua"),
            get: script!("get.lua"),
            delete: script!("delete.lua"),
            purge: script!("purge.lua"),
            step_begin: script!("step_begin.lua"),
            step_finish: script!("step_finish.lua"),
            steps: script!("steps.lua"),
            resolve: script!("resolve.lua"),
        }
    }

    /// Every script, for loading them all.
    pub(crate) fn all(&self) -> [&Script; 12] {
        [
            &self.claim,
            &self.complete,
            &self.fail,
            &self.extend,
            &self.release,
            &self.get,
            &self.delete,
            &self.purge,
            &self.step_begin,
            &self.step_finish,
            &self.steps,
            &self.resolve,
        ]
    }

    /// The SHA-1 of the claim script, for `redis-benchmark EVALSHA`.
    pub(crate) fn claim_sha(&self) -> &str {
        &self.claim.sha
    }
}
