//! A consumer run as the fault engine's [target](super::super::Target):
//! its servers and proxies, how each fault is injected, when it has
//! settled, and the evidence it is judged on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::judge::{emitted, judge, judge_hop, records_final, Evidence};
use super::workers::{proxy, publish_over, Workers};
use super::{workload, ChaosPlan};
use crate::chaos::engine::{Clock, Injected, Target};
use crate::chaos::fault::{Fault, Link};
use crate::chaos::report::{Findings, Violation};
use crate::consumers::scenario::{LEASE, PIPELINE_VAR};
use crate::consumers::under_test::ChaosBroker;
use crate::doubles::proxy::FaultProxy;
use crate::servers::redis::RedisServer;

/// A consumer run's servers, proxies, workers and workload.
pub(super) struct ConsumerRun<B: ChaosBroker> {
    name: String,
    plan: ChaosPlan,
    broker: Option<B::Server>,
    redis: Option<RedisServer>,
    broker_proxy: FaultProxy,
    store_proxy: FaultProxy,
    /// The destination reached directly (the publisher, the judge).
    direct: B,
    /// A pipeline's next hop, reached directly (the judge).
    output: Option<B>,
    messages: Vec<(String, String)>,
    good: Vec<String>,
    poison: Vec<String>,
    workers: Workers,
    restarting: Arc<AtomicBool>,
    published: Arc<AtomicUsize>,
    publisher: Option<JoinHandle<usize>>,
    /// Kills so far: the next one's aim (the worker that started a
    /// handler last, wrote last, or, in a pipeline, sent last or wrote
    /// last at the next hop) goes round.
    kills: usize,
    settle: Settle<B::Store>,
}

/// How far the run has settled after the fault phase.
struct Settle<S> {
    store: Option<S>,
    written: bool,
    all_final: bool,
    checked: Option<Instant>,
    /// A pipeline's next hop: its store, the messages the first hop's
    /// completed runs emitted (per key), and whether they are all
    /// written and completed there.
    hop_store: Option<S>,
    emitted: Option<std::collections::BTreeMap<String, Vec<String>>>,
    hop_written: bool,
    hop_final: bool,
}

impl<S> Settle<S> {
    /// The ids the first hop's completed runs emitted.
    fn ids(&self) -> Vec<String> {
        self.emitted
            .iter()
            .flat_map(|e| e.values().flatten().cloned())
            .collect()
    }
}

impl<B: ChaosBroker> ConsumerRun<B> {
    /// Starts the broker, the store (unless it lives on the broker's
    /// server) and a fault proxy in front of each.
    pub(super) async fn start_servers(name: &str, plan: &ChaosPlan) -> Self {
        let mut rng = StdRng::seed_from_u64(plan.seed);
        let broker = tokio::task::spawn_blocking(B::start_server)
            .await
            .expect("broker task")
            .expect("a broker of the run's own");
        let redis = match B::store_port(&broker) {
            Some(_) => None,
            None => Some(
                RedisServer::start_with(
                    crate::free_port().expect("port"),
                    &["--appendonly", "yes", "--appendfsync", "always"],
                )
                .expect("redis-server"),
            ),
        };
        let store_port = B::store_port(&broker)
            .or(redis.as_ref().map(RedisServer::port))
            .expect("a store");
        let broker_proxy = proxy(B::advertised_port(&broker).unwrap_or(0), B::port(&broker)).await;
        let store_proxy = proxy(0, store_port).await;
        let direct = B::create_at(name, B::port(&broker), &B::store_url(store_port)).await;
        let through = direct.through(
            broker_proxy.addr().port(),
            &B::store_url(store_proxy.addr().port()),
        );
        let output = match plan.pipeline {
            true => {
                let output = direct.output();
                output.declare().await;
                Some(output)
            }
            false => None,
        };
        let mut env = through.env();
        if plan.pipeline {
            env.push((PIPELINE_VAR, "1".to_owned()));
        }
        let messages = workload(plan, &mut rng);
        let mut poison: Vec<String> = messages
            .iter()
            .filter(|(_, body)| body.contains(r#""poison":true"#))
            .map(|(key, _)| key.clone())
            .collect();
        poison.sort();
        poison.dedup();
        let good = (0..plan.keys)
            .map(|i| format!("c-{i}"))
            .filter(|k| !poison.contains(k))
            .collect();
        Self {
            name: name.to_owned(),
            plan: plan.clone(),
            broker: Some(broker),
            redis,
            broker_proxy,
            store_proxy,
            direct,
            output,
            messages,
            good,
            poison,
            workers: Workers::new(env),
            restarting: Arc::new(AtomicBool::new(false)),
            published: Arc::new(AtomicUsize::new(0)),
            publisher: None,
            kills: 0,
            settle: Settle {
                store: None,
                written: false,
                all_final: false,
                checked: None,
                hop_store: None,
                emitted: None,
                hop_written: false,
                hop_final: false,
            },
        }
    }
}

impl<B: ChaosBroker> Target for ConsumerRun<B> {
    type Error = std::convert::Infallible;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn faults(&self) -> Vec<Fault> {
        ChaosPlan::FAULTS
            .into_iter()
            .filter(|f| match f {
                Fault::BrokerRestart => B::RESTARTS,
                Fault::StoreRestart => self.redis.is_some(),
                _ => true,
            })
            .collect()
    }

    fn proxies(&self, link: Link) -> Vec<&FaultProxy> {
        match link {
            Link::Idem => vec![&self.store_proxy],
            Link::Broker => vec![&self.broker_proxy],
        }
    }

    async fn start(&mut self) -> Result<(), Self::Error> {
        for _ in 0..self.plan.workers {
            self.workers.spawn();
        }
        self.publisher = Some(tokio::spawn(publish_over(
            self.direct.clone(),
            self.messages.clone(),
            self.plan.duration,
            Arc::clone(&self.restarting),
            Arc::clone(&self.published),
        )));
        Ok(())
    }

    async fn step(&mut self, _clock: &Clock) -> Result<(), Self::Error> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.workers.replace_exited();
        Ok(())
    }

    async fn inject(
        &mut self,
        fault: Fault,
        clock: &Clock,
        rng: &mut StdRng,
    ) -> Result<Injected, Self::Error> {
        let ledger = self.direct.ledger();
        Ok(match fault {
            Fault::Kill => {
                // In turn mid-handler, between an effect and its
                // acknowledgement, and in a pipeline between a stored
                // completion and its messages' confirmation, and at the
                // next hop between its effect and acknowledgement.
                let aims = if self.output.is_some() { 4 } else { 2 };
                let busy = match self.kills % aims {
                    0 => ledger.latest_starter(),
                    1 => ledger.latest_writer(),
                    2 => ledger.latest_sender(),
                    _ => self
                        .output
                        .as_ref()
                        .and_then(|o| o.ledger().latest_writer()),
                };
                self.kills += 1;
                let slot = self.workers.slot_of(busy, rng);
                self.workers.kill(slot);
                Injected::Done
            }
            Fault::Stop => {
                let slot = self.workers.slot_of(ledger.latest_starter(), rng);
                let pause = LEASE.mul_f64(rng.random_range(1.5..3.0));
                match self.workers.stop(slot) {
                    Some(pid) => Injected::Stopped {
                        pid,
                        until: clock.now + pause,
                    },
                    None => Injected::Missed,
                }
            }
            Fault::Leave => {
                let slot = self.workers.slot_of(ledger.latest_starter(), rng);
                if self.workers.leave(slot) {
                    Injected::Done
                } else {
                    Injected::Missed
                }
            }
            Fault::BrokerRestart => {
                let Some(mut broker) = self.broker.take() else {
                    return Ok(Injected::Missed);
                };
                self.restarting.store(true, Ordering::SeqCst);
                self.broker = Some(
                    tokio::task::spawn_blocking(move || {
                        B::restart(&mut broker).expect("restart the broker");
                        broker
                    })
                    .await
                    .expect("restart task"),
                );
                self.restarting.store(false, Ordering::SeqCst);
                Injected::Done
            }
            Fault::StoreRestart => {
                let Some(mut server) = self.redis.take() else {
                    return Ok(Injected::Missed);
                };
                self.redis = Some(
                    tokio::task::spawn_blocking(move || {
                        server.stop();
                        server.start_again().expect("start the store again");
                        server
                    })
                    .await
                    .expect("restart task"),
                );
                Injected::Done
            }
            _ => Injected::Missed,
        })
    }

    fn resume(&mut self, pid: u32) {
        self.workers.resume(pid);
    }

    fn progress(&self) -> (usize, usize) {
        (self.published.load(Ordering::SeqCst), self.messages.len())
    }

    fn publishing(&self) -> bool {
        !self.publisher.as_ref().is_none_or(JoinHandle::is_finished)
    }

    async fn settled(&mut self) -> bool {
        let now = Instant::now();
        if self
            .settle
            .checked
            .is_some_and(|at| now.duration_since(at) < Duration::from_millis(200))
        {
            return false;
        }
        self.settle.checked = Some(now);
        let ledger = self.direct.ledger();
        if !self.settle.written {
            self.settle.written = self.good.iter().all(|k| ledger.downstream(k).is_some());
            if !self.settle.written {
                return false;
            }
        }
        if self.settle.store.is_none() {
            self.settle.store = Some(self.direct.store().await);
        }
        let Some(store) = self.settle.store.as_ref() else {
            return false;
        };
        if !self.settle.all_final {
            self.settle.all_final = records_final(store, &self.good, &self.poison).await;
            if !self.settle.all_final {
                return false;
            }
        }
        if !self.direct.settled(self.poison.len()).await {
            return false;
        }
        match self.output.clone() {
            Some(output) => self.hop_settled(&output).await,
            None => true,
        }
    }

    fn unsettled(&self, _clock: &Clock, limit: Duration) -> Vec<Violation> {
        vec![Violation::run(format!(
            "the run did not settle within {limit:?} of the fault phase's end or its last \
             publish (every published: {}; every good key written: {}; every record completed \
             or failed: {}; every emitted message written at the next hop: {}; completed \
             there: {})",
            !self.publishing(),
            self.settle.written,
            self.settle.all_final,
            self.settle.hop_written,
            self.settle.hop_final,
        ))]
    }

    async fn finish(&mut self) -> Result<Findings, Self::Error> {
        let published = match self.publisher.take() {
            Some(publisher) => publisher.await.expect("publisher task"),
            None => 0,
        };
        // Late duplicates and redeliveries show themselves before judging.
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.workers.stop_all();
        let store = match self.settle.store.take() {
            Some(store) => store,
            None => self.direct.store().await,
        };
        let ledger = self.direct.ledger();
        let evidence = Evidence::gather(ledger, &store, &self.good, &self.poison).await;
        let dead = self.direct.dead_letters().await;
        let mut violations: Vec<Violation> = judge(&evidence, &dead, &self.poison)
            .into_iter()
            .map(Violation::run)
            .collect();
        let starts = evidence.starts.values().map(Vec::len).sum::<usize>();
        let mut counts = vec![
            ("published", published as u64),
            ("starts", starts as u64),
            ("stale", ledger.stale_writes() as u64),
            ("exits", self.workers.exits() as u64),
        ];
        if let Some(output) = self.output.clone() {
            let (found, hop_counts) = self.judge_hop(&output, &store).await;
            violations.extend(found);
            counts.extend(hop_counts);
        }
        Ok(Findings {
            keys: self.plan.keys,
            counts,
            violations,
            ..Findings::default()
        })
    }
}

impl<B: ChaosBroker> ConsumerRun<B> {
    /// Whether the pipeline's next hop has settled: every message the
    /// first hop's completed runs emitted written and completed there, and
    /// nothing unsettled on its destination.
    async fn hop_settled(&mut self, output: &B) -> bool {
        if self.settle.emitted.is_none() {
            let Some(store) = self.settle.store.as_ref() else {
                return false;
            };
            self.settle.emitted = Some(emitted(store, &self.good).await);
        }
        let ids = self.settle.ids();
        if !self.settle.hop_written {
            let ledger = output.ledger();
            self.settle.hop_written = ids.iter().all(|id| ledger.downstream(id).is_some());
            if !self.settle.hop_written {
                return false;
            }
        }
        if self.settle.hop_store.is_none() {
            self.settle.hop_store = Some(output.store().await);
        }
        let Some(store) = self.settle.hop_store.as_ref() else {
            return false;
        };
        if !self.settle.hop_final {
            self.settle.hop_final = records_final(store, &ids, &[]).await;
            if !self.settle.hop_final {
                return false;
            }
        }
        output.settled(0).await
    }

    /// The next hop's violations (prefixed `next hop:`) and counts: each
    /// good key's completed run emitted one message, which the next hop
    /// completed once, fenced, with nothing else started and nothing
    /// dead-lettered there.
    async fn judge_hop(
        &mut self,
        output: &B,
        store: &B::Store,
    ) -> (Vec<Violation>, Vec<(&'static str, u64)>) {
        let sent = emitted(store, &self.good).await;
        let ids: Vec<String> = sent.values().flatten().cloned().collect();
        let hop_store = match self.settle.hop_store.take() {
            Some(hop_store) => hop_store,
            None => output.store().await,
        };
        let ledger = output.ledger();
        let evidence = Evidence::gather(ledger, &hop_store, &ids, &[]).await;
        let dead = output.dead_letters().await;
        let started: Vec<String> = evidence.starts.keys().cloned().collect();
        let found: Vec<Violation> = judge_hop(&sent, &started)
            .into_iter()
            .chain(
                judge(&evidence, &dead, &[])
                    .into_iter()
                    .map(|v| format!("next hop: {v}")),
            )
            .map(Violation::run)
            .collect();
        let starts = evidence.starts.values().map(Vec::len).sum::<usize>();
        let sends = self.direct.ledger().sends();
        (
            found,
            vec![
                ("emitted", ids.len() as u64),
                ("sends", sends as u64),
                ("hop starts", starts as u64),
            ],
        )
    }
}
