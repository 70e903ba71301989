//! A consumer run's processes: the worker processes (started, killed,
//! stopped, told to leave, replaced) and the publisher.

use std::net::SocketAddr;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use crate::consumers::ledger::Work;
use crate::consumers::scenario::{spawn_worker, MEMBER_VAR};
use crate::consumers::under_test::ChaosBroker;
use crate::doubles::proxy::FaultProxy;

/// A fault proxy on loopback port `listen` (a free one for 0) in front
/// of the loopback `port`.
pub(super) async fn proxy(listen: u16, port: u16) -> FaultProxy {
    FaultProxy::start_on(listen, SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("fault proxy")
}

/// Publishes `messages` evenly over `over`, pausing while the broker
/// restarts. Each publish runs in a task of its own so that one failing
/// as the broker goes down (the adapters' test helpers panic on errors)
/// is tried again: a message the broker stored before the failure is then
/// there twice, a duplicate like the others. How many messages went out.
pub(super) async fn publish_over<B: ChaosBroker>(
    setup: B,
    messages: Vec<(String, String)>,
    over: Duration,
    restarting: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
) -> usize {
    let gap = over.div_f64(messages.len().max(1) as f64 * 1.25);
    let mut published = 0;
    for (key, body) in messages {
        loop {
            while restarting.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (setup, key, body) = (setup.clone(), key.clone(), body.clone());
            let attempt = tokio::spawn(async move { setup.publish(Some(&key), &body).await });
            match tokio::time::timeout(Duration::from_secs(20), attempt).await {
                Ok(Ok(())) => break,
                _ => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
        published += 1;
        count.store(published, Ordering::SeqCst);
        tokio::time::sleep(gap).await;
    }
    published
}

/// Sends `signal` to process `pid` with the shell's own `kill` (no
/// procps needed), only ever to a positive process id.
fn send(pid: u32, signal: &str) -> bool {
    pid > 0
        && std::process::Command::new("sh")
            .args([
                "-c",
                r#"kill -s "$1" -- "$2""#,
                "sh",
                signal,
                &pid.to_string(),
            ])
            .status()
            .is_ok_and(|s| s.success())
}

/// A worker process and the member name of its slot ([`MEMBER_VAR`]),
/// which its replacement takes over.
struct Member {
    name: usize,
    process: Child,
}

/// The worker processes, by slot, and those leaving.
pub(super) struct Workers {
    env: Vec<(&'static str, String)>,
    running: Vec<Member>,
    /// Workers told to leave, until they have exited.
    leaving: Vec<Member>,
    /// Slots named so far.
    named: usize,
    exits: usize,
}

impl Workers {
    /// No workers yet; each will run with `env`.
    pub(super) fn new(env: Vec<(&'static str, String)>) -> Self {
        Self {
            env,
            running: Vec::new(),
            leaving: Vec::new(),
            named: 0,
            exits: 0,
        }
    }

    /// Workers that exited by themselves (and were replaced).
    pub(super) fn exits(&self) -> usize {
        self.exits
    }

    /// Starts a worker in a new slot.
    pub(super) fn spawn(&mut self) {
        let member = self.start(self.named);
        self.named += 1;
        self.running.push(member);
    }

    /// Starts a worker process named `name`.
    fn start(&self, name: usize) -> Member {
        let mut env = self.env.clone();
        env.push((MEMBER_VAR, format!("w{name}")));
        Member {
            name,
            process: spawn_worker(env, &Work::Fenced),
        }
    }

    /// The slot of the worker with process id `pid`, or a random one.
    pub(super) fn slot_of(&self, pid: Option<u32>, rng: &mut StdRng) -> usize {
        pid.and_then(|pid| self.running.iter().position(|w| w.process.id() == pid))
            .unwrap_or_else(|| rng.random_range(0..self.running.len()))
    }

    /// SIGKILLs the worker in `slot` and starts a new one there.
    pub(super) fn kill(&mut self, slot: usize) {
        let Some(worker) = self.running.get_mut(slot) else {
            return;
        };
        let _ = worker.process.kill();
        let _ = worker.process.wait();
        let name = worker.name;
        self.running[slot] = self.start(name);
    }

    /// Closes the stdin of the worker in `slot`, so that it stops cleanly
    /// (see [`worker_main`](crate::consumers::scenario::worker_main)); a worker
    /// of the same name takes its place once it has gone, as in a rolling
    /// restart. Whether it was told: the last worker running never is.
    pub(super) fn leave(&mut self, slot: usize) -> bool {
        if slot >= self.running.len() || self.running.len() < 2 {
            return false;
        }
        let mut old = self.running.remove(slot);
        drop(old.process.stdin.take());
        self.leaving.push(old);
        true
    }

    /// Stops (SIGSTOP) the worker in `slot`; its process id if it was
    /// stopped.
    pub(super) fn stop(&self, slot: usize) -> Option<u32> {
        let pid = self.running.get(slot).map(|w| w.process.id())?;
        send(pid, "STOP").then_some(pid)
    }

    /// Continues worker process `pid` if it is still one of the running
    /// or leaving workers (a stopped worker may have been killed and
    /// replaced since; one told to leave must run to leave).
    pub(super) fn resume(&self, pid: u32) {
        if self
            .running
            .iter()
            .chain(&self.leaving)
            .any(|w| w.process.id() == pid)
        {
            send(pid, "CONT");
        }
    }

    /// Replaces workers that exited by themselves, and those that left
    /// once they have gone, each by a worker of the same name.
    pub(super) fn replace_exited(&mut self) {
        let mut gone = Vec::new();
        self.leaving.retain_mut(|w| {
            let exited = matches!(w.process.try_wait(), Ok(Some(_)));
            if exited {
                gone.push(w.name);
            }
            !exited
        });
        for name in gone {
            let member = self.start(name);
            self.running.push(member);
        }
        for slot in 0..self.running.len() {
            if matches!(self.running[slot].process.try_wait(), Ok(Some(_))) {
                self.exits += 1;
                let name = self.running[slot].name;
                self.running[slot] = self.start(name);
            }
        }
    }

    pub(super) fn stop_all(&mut self) {
        for worker in self.running.iter_mut().chain(&mut self.leaving) {
            let _ = worker.process.kill();
            let _ = worker.process.wait();
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop_all();
    }
}
