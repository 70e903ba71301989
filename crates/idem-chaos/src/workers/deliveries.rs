//! The broker's deliveries: queued, handed out to workers with room,
//! taken back at their visibility timeout, and answered.

use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use tokio::io::AsyncWriteExt;

use super::{Broker, Event, Said};
use crate::check::Violation;
use crate::error::{harness, ChaosError};

impl Broker {
    /// Takes the deliveries `slot` holds back into the queue.
    pub(super) fn requeue_all(&mut self, slot: usize, now: Instant) {
        let Some(worker) = self.workers[slot].as_mut() else {
            return;
        };
        let held: Vec<usize> = worker.outstanding.drain().collect();
        for id in held {
            self.deliveries[id].holder = None;
            self.queue(now, id);
        }
    }

    /// Queues delivery `id` to be handed out at `due`, moving it if it is
    /// queued already.
    pub(super) fn queue(&mut self, due: Instant, id: usize) {
        let d = &mut self.deliveries[id];
        if let Some(old) = d.queued.replace(due) {
            self.pending.remove(&(old, id));
        }
        self.pending.insert((due, id));
    }

    /// Whether an answer to attempt `attempt` of delivery `id` is the
    /// current one (not a late answer to a delivery handed out again); if
    /// so the delivery is taken back from its worker.
    pub(super) fn answered(&mut self, id: usize, attempt: u32) -> Result<bool, ChaosError> {
        let d = self
            .deliveries
            .get(id)
            .ok_or_else(|| harness(format!("a worker answered unknown delivery {id}")))?;
        if d.acked || d.attempt != attempt {
            return Ok(false);
        }
        self.take_back(id);
        Ok(true)
    }

    /// Takes delivery `id` back from the worker holding it.
    pub(super) fn take_back(&mut self, id: usize) {
        if let Some((slot, _)) = self.deliveries[id].holder.take() {
            if let Some(w) = self.workers[slot].as_mut() {
                w.outstanding.remove(&id);
            }
        }
    }

    pub(super) fn handle(&mut self, event: Event, now: Instant) -> Result<(), ChaosError> {
        let current = self.workers[event.slot]
            .as_ref()
            .is_some_and(|w| w.generation == event.generation);
        match event.said {
            Said::Exit if current => {
                let log = self
                    .dir
                    .join(format!("worker-{}-{}.err", event.slot, event.generation));
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: String = tail.lines().rev().take(5).collect::<Vec<_>>().join(" / ");
                self.crashes.push(Violation {
                    key: None,
                    what: format!("a worker exited on its own: {tail}"),
                });
                self.requeue_all(event.slot, now);
                self.workers[event.slot] = None;
                self.spawn(event.slot)?;
            }
            Said::Exit => {}
            Said::Ack {
                id,
                attempt,
                outcome,
            } => {
                if !self.answered(id, attempt)? {
                    return Ok(());
                }
                let d = &mut self.deliveries[id];
                d.acked = true;
                if let Some(due) = d.queued.take() {
                    self.pending.remove(&(due, id));
                }
                self.acked += 1;
                match outcome.as_str() {
                    "executed" => self.tally.acked_executed += 1,
                    "replayed" => self.tally.acked_replayed += 1,
                    _ => self.unguarded += 1,
                }
            }
            Said::Nack {
                id,
                attempt,
                retry,
                reason,
            } => {
                *self.tally.retry_reasons.entry(reason).or_insert(0) += 1;
                if !self.answered(id, attempt)? {
                    return Ok(());
                }
                self.queue(now + retry.min(Duration::from_secs(1)), id);
            }
        }
        Ok(())
    }

    /// Hands out due deliveries to running workers with room, and takes
    /// back those held past the visibility timeout.
    pub(super) async fn dispatch(&mut self, now: Instant, inflight: usize) {
        let mut expired = Vec::new();
        for w in self.workers.iter().flatten() {
            for id in &w.outstanding {
                if let Some((_, since)) = self.deliveries[*id].holder {
                    if now.duration_since(since) > self.visibility {
                        expired.push(*id);
                    }
                }
            }
        }
        for id in expired {
            self.take_back(id);
            self.queue(now, id);
        }
        let mut slots = self.running_slots();
        slots.shuffle(&mut self.rng);
        'slots: for slot in slots {
            loop {
                let room = self.workers[slot]
                    .as_ref()
                    .is_some_and(|w| w.outstanding.len() < inflight);
                if !room {
                    continue 'slots;
                }
                let Some(&(due, id)) = self.pending.first() else {
                    return;
                };
                if due > now {
                    return;
                }
                self.pending.pop_first();
                let d = &mut self.deliveries[id];
                d.queued = None;
                if d.attempt > 0 {
                    self.tally.redeliveries += 1;
                }
                d.attempt += 1;
                d.holder = Some((slot, now));
                let line = format!("D {id} {} {}\n", d.attempt, self.keys[d.key]);
                let Some(w) = self.workers[slot].as_mut() else {
                    continue 'slots;
                };
                w.outstanding.insert(id);
                // A dead worker's pipe fails; its Exit event requeues.
                let _ = w.stdin.write_all(line.as_bytes()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::worker::WorkerConfig;
    use crate::{Plan, Target};

    fn broker() -> Broker {
        let plan = Plan {
            keys: 3,
            duplicates: 0.0,
            ..Plan::new(Target::SqliteLease, "/nonexistent")
        };
        let config = WorkerConfig {
            target: plan.target,
            store_url: String::new(),
            downstream_url: String::new(),
            lease: plan.lease,
            inflight: plan.inflight,
            ledger_dir: PathBuf::new(),
        };
        Broker::new(&plan, config, PathBuf::new())
    }

    /// Hands delivery `id` to `slot` as `dispatch` does, without a worker.
    fn hand_out(b: &mut Broker, id: usize, slot: usize, now: Instant) {
        assert_eq!(b.pending.pop_first().map(|(_, p)| p), Some(id));
        let d = &mut b.deliveries[id];
        d.queued = None;
        d.attempt += 1;
        d.holder = Some((slot, now));
    }

    /// A delivery taken back at its visibility timeout, then answered by
    /// the worker that held it, is queued once: queued twice it would be
    /// handed to two workers and leak a slot in one of them, and the run
    /// would stop handing out work (the DynamoDB short run's stalls).
    #[test]
    fn a_late_answer_moves_a_requeued_delivery_instead_of_queuing_it_again() {
        let mut b = broker();
        let now = Instant::now();
        b.queue(now, 0);
        hand_out(&mut b, 0, 1, now);
        b.take_back(0);
        b.queue(now, 0);
        let nack = Said::Nack {
            id: 0,
            attempt: 1,
            retry: Duration::from_millis(200),
            reason: "busy".into(),
        };
        b.handle(
            Event {
                slot: 1,
                generation: 0,
                said: nack,
            },
            now,
        )
        .expect("a current answer");
        assert_eq!(b.pending.len(), 1, "{:?}", b.pending);
        assert_eq!(
            b.deliveries[0].queued,
            Some(now + Duration::from_millis(200))
        );

        // A late acknowledgement takes it out of the queue altogether.
        let ack = Said::Ack {
            id: 0,
            attempt: 1,
            outcome: "executed".into(),
        };
        b.handle(
            Event {
                slot: 1,
                generation: 0,
                said: ack,
            },
            now,
        )
        .expect("a current answer");
        assert!(b.pending.is_empty(), "{:?}", b.pending);
        assert_eq!(b.acked, 1);
    }
}
