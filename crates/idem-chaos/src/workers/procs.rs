//! The broker's worker processes: started, killed (one, or all at once as
//! a store that lives in its clients' processes crashes), signalled and
//! told about clock jumps.

use std::collections::HashSet;
use std::fs::File;
use std::process::Stdio;
use std::time::Instant;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::{parse_line, Broker, Event, Said, WorkerProc};
use crate::error::{harness, ChaosError};

impl Broker {
    pub(super) fn spawn(&mut self, slot: usize) -> Result<(), ChaosError> {
        let generation = self.next_generation;
        self.next_generation += 1;
        let log = self.dir.join(format!("worker-{slot}-{generation}.err"));
        let stderr = File::create(&log).map_err(|e| harness(format!("{}: {e}", log.display())))?;
        // Where clients' clocks decide, each worker's disagrees with the
        // others' by up to half a lease.
        let half = i64::try_from(self.config.lease.as_millis() / 2).unwrap_or(i64::MAX);
        let skew = if self.config.target.skews_worker_clocks() {
            self.rng.random_range(-half..=half)
        } else {
            0
        };
        let mut child = Command::new(&self.worker_bin)
            .arg("worker")
            .envs(self.config.to_env())
            .env(crate::worker::SKEW_ENV, skew.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| harness(format!("starting a worker: {e}")))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| harness("a worker without a PID"))?;
        let stdin = child.stdin.take().ok_or_else(|| harness("no stdin pipe"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| harness("no stdout pipe"))?;
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(said) = parse_line(&line) {
                    let _ = events.send(Event {
                        slot,
                        generation,
                        said,
                    });
                }
            }
            let _ = events.send(Event {
                slot,
                generation,
                said: Said::Exit,
            });
        });
        self.workers[slot] = Some(WorkerProc {
            child,
            pid: Pid::from_raw(pid),
            stdin,
            generation,
            outstanding: HashSet::new(),
            stopped: false,
        });
        Ok(())
    }

    /// SIGKILLs every worker at once (through `Child::start_kill`), waits
    /// for them all and starts replacements: the crash of a store that
    /// lives in its clients' processes.
    pub(super) async fn kill_all(&mut self, now: Instant) -> Result<(), ChaosError> {
        let mut dead = Vec::new();
        for slot in 0..self.workers.len() {
            self.requeue_all(slot, now);
            if let Some(mut worker) = self.workers[slot].take() {
                let _ = worker.child.start_kill();
                dead.push(worker.child);
            }
        }
        for mut child in dead {
            let _ = child.wait().await;
        }
        for slot in 0..self.workers.len() {
            self.spawn(slot)?;
        }
        Ok(())
    }

    /// SIGKILLs the worker in `slot` (by PID, through `Child::kill`) and
    /// starts a replacement.
    pub(super) async fn kill(&mut self, slot: usize, now: Instant) -> Result<(), ChaosError> {
        self.requeue_all(slot, now);
        if let Some(mut worker) = self.workers[slot].take() {
            let _ = worker.child.kill().await;
        }
        self.spawn(slot)
    }

    /// Writes `line` to the worker in `slot` (a dead one's pipe fails; its
    /// end is noticed elsewhere).
    pub(super) async fn tell(&mut self, slot: usize, line: &str) {
        if let Some(worker) = self.workers[slot].as_mut() {
            let _ = worker.stdin.write_all(line.as_bytes()).await;
        }
    }

    pub(super) fn signal(&self, slot: usize, signal: Signal) {
        if let Some(worker) = &self.workers[slot] {
            // The PID is our own live child's, checked positive at spawn.
            let _ = kill(worker.pid, signal);
        }
    }

    pub(super) fn running_slots(&self) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|s| self.workers[*s].as_ref().is_some_and(|w| !w.stopped))
            .collect()
    }

    /// Running workers holding deliveries, or else all running workers:
    /// a process fault should land in the middle of work.
    pub(super) fn busy_slots(&self) -> Vec<usize> {
        let running = self.running_slots();
        let busy: Vec<usize> = running
            .iter()
            .copied()
            .filter(|s| {
                self.workers[*s]
                    .as_ref()
                    .is_some_and(|w| !w.outstanding.is_empty())
            })
            .collect();
        if busy.is_empty() {
            running
        } else {
            busy
        }
    }

    /// A slot drawn from the busy workers' by `pick`.
    pub(super) fn busy_slot(&self, pick: usize) -> Option<usize> {
        let slots = self.busy_slots();
        slots.get(pick % slots.len().max(1)).copied()
    }

    pub(super) async fn stop_workers(&mut self) {
        for slot in 0..self.workers.len() {
            self.signal(slot, Signal::SIGCONT);
            if let Some(mut worker) = self.workers[slot].take() {
                let _ = worker.child.kill().await;
            }
        }
    }
}
