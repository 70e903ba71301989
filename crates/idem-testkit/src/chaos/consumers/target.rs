//! A consumer run as the fault engine's [target](super::super::Target):
//! its servers and proxies, how each fault is injected, when it has
//! settled, and the evidence it is judged on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::judge::{judge, records_final, Evidence};
use super::workers::{proxy, publish_over, Workers};
use super::{workload, ChaosPlan};
use crate::chaos::engine::{Clock, Injected, Target};
use crate::chaos::fault::{Fault, Link};
use crate::chaos::report::{Findings, Violation};
use crate::consumers::scenario::LEASE;
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
    messages: Vec<(String, String)>,
    good: Vec<String>,
    poison: Vec<String>,
    workers: Workers,
    restarting: Arc<AtomicBool>,
    published: Arc<AtomicUsize>,
    publisher: Option<JoinHandle<usize>>,
    /// Whether the next kill hits the worker that wrote last (else the
    /// one that started a handler last).
    kill_writer: bool,
    settle: Settle<B::Store>,
}

/// How far the run has settled after the fault phase.
struct Settle<S> {
    store: Option<S>,
    written: bool,
    all_final: bool,
    checked: Option<Instant>,
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
            messages,
            good,
            poison,
            workers: Workers::new(through.env()),
            restarting: Arc::new(AtomicBool::new(false)),
            published: Arc::new(AtomicUsize::new(0)),
            publisher: None,
            kill_writer: false,
            settle: Settle {
                store: None,
                written: false,
                all_final: false,
                checked: None,
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
                // Alternately mid-handler and between an effect and its
                // acknowledgement.
                let busy = if self.kill_writer {
                    ledger.latest_writer()
                } else {
                    ledger.latest_starter()
                };
                self.kill_writer = !self.kill_writer;
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
        self.direct.settled(self.poison.len()).await
    }

    fn unsettled(&self, _clock: &Clock, limit: Duration) -> Vec<Violation> {
        vec![Violation::run(format!(
            "the run did not settle within {limit:?} of the fault phase's end or its last \
             publish (every published: {}; every good key written: {}; every record completed \
             or failed: {})",
            !self.publishing(),
            self.settle.written,
            self.settle.all_final
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
        let violations = judge(&evidence, &dead, &self.poison)
            .into_iter()
            .map(Violation::run)
            .collect();
        let starts = evidence.starts.values().map(Vec::len).sum::<usize>();
        Ok(Findings {
            keys: self.plan.keys,
            counts: vec![
                ("published", published as u64),
                ("starts", starts as u64),
                ("stale", ledger.stale_writes() as u64),
                ("exits", self.workers.exits() as u64),
            ],
            violations,
            ..Findings::default()
        })
    }
}
