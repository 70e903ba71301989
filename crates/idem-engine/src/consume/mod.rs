//! The broker consumer of every language, deciding as
//! [`idem_consumer::Consumer`] decides.
//!
//! A broker adapter (aio-pika, the AWS SDK for SQS) hands each message to
//! [`ConsumerGuard::begin`]. The consumer layer itself reads the key,
//! claims it, and settles duplicates, keys in progress elsewhere and bad
//! keys ([`Delivered::Settled`]); when the message is to run, it gives the
//! adapter its [`DeliveryTurn`]. The adapter runs the handler in its own
//! language, under the run's [`RunContext`], and hands the result (JSON)
//! to [`DeliveryTurn::complete`] or the failure to [`DeliveryTurn::fail`],
//! which store it and settle the message. The [`Settlement`] says what to do on the broker (ack,
//! retry after a delay, dead-letter with idem's headers), as
//! `idem-consumer/docs/dispositions.md` tables it; the adapter only
//! carries it out.
//!
//! ```
//! use idem_engine::consume::{Action, ConsumeOptions, ConsumerGuard, Delivered, Delivery};
//! use idem_engine::{Engine, EngineOptions};
//!
//! let engine = Engine::open("memory:", EngineOptions::default())?;
//! let here = engine.here()?;
//! let options = ConsumeOptions { scope: "orders".into(), ..ConsumeOptions::default() };
//! let guard = ConsumerGuard::new(&here, options)?;
//! let order = || Delivery {
//!     payload: br#"{"order":7}"#.to_vec(),
//!     headers: vec![("Idempotency-Key".into(), "order-7".into())],
//!     ..Delivery::default()
//! };
//! let Delivered::Turn(turn) = here.block_on(guard.begin(&here, order()))? else {
//!     panic!("the first delivery runs")
//! };
//! let done = here.block_on(turn.complete(Ok(br#"{"shipped":true}"#.to_vec())))?;
//! assert_eq!(done.action, Action::Ack);
//!
//! let Delivered::Settled(again) = here.block_on(guard.begin(&here, order()))? else {
//!     panic!("a redelivery does not run")
//! };
//! assert!(again.action == Action::Ack && again.replayed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod delivery;
mod options;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem::FailureClass;
use idem_consumer::Consumer;
use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

pub use delivery::{Action, Delivery, Settlement};
pub use options::ConsumeOptions;

use crate::error::{EngineError, HandlerFailure};
use crate::local::Local;
use crate::run::RunContext;
use crate::store::AnyStore;

/// The consumer over one engine: built from [`ConsumeOptions`] once, and
/// again in a forked child.
pub struct ConsumerGuard {
    options: ConsumeOptions,
    built: Mutex<(Arc<Local>, Consumer<AnyStore>)>,
}

impl std::fmt::Debug for ConsumerGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerGuard")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What the consumer made of a delivery.
#[derive(Debug)]
pub enum Delivered {
    /// Settle it so: a duplicate, a key in progress elsewhere, a bad key.
    /// The handler does not run.
    Settled(Settlement),
    /// Run the handler, then hand its result to [`DeliveryTurn::complete`]
    /// (or its failure to [`DeliveryTurn::fail`]).
    Turn(DeliveryTurn),
}

/// The handler's answer, as the consumer layer waits for it.
type Answer = Result<Box<RawValue>, HandlerFailure>;

type SettleFuture = Pin<Box<dyn Future<Output = Result<Settlement, EngineError>> + Send>>;

/// A delivery's turn to run: the claim is held (the heartbeat on the
/// engine's runtime) until [`complete`](Self::complete) or
/// [`fail`](Self::fail). Dropped without either,
/// the delivery ends as a retryable failure.
pub struct DeliveryTurn {
    context: RunContext,
    key: String,
    respond: Mutex<Option<oneshot::Sender<Answer>>>,
    settled: Mutex<Option<SettleFuture>>,
}

impl std::fmt::Debug for DeliveryTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryTurn")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// The handler's turn, as the consumer layer hands it over.
struct Turn {
    ctx: idem::Context,
    key: String,
    respond: oneshot::Sender<Answer>,
}

impl ConsumerGuard {
    /// The consumer over `local`'s store, its options checked.
    pub fn new(local: &Arc<Local>, options: ConsumeOptions) -> Result<Self, EngineError> {
        let consumer = options.consumer(local)?;
        Ok(Self {
            options,
            built: Mutex::new((Arc::clone(local), consumer)),
        })
    }

    /// The consumer for `local`: built again in a forked child, whose
    /// parent's is left untouched (see [`Engine::here`](crate::Engine::here)).
    fn consumer(&self, local: &Arc<Local>) -> Result<Consumer<AnyStore>, EngineError> {
        let mut built = self.built.lock();
        if !Arc::ptr_eq(&built.0, local) {
            let fresh = (Arc::clone(local), self.options.consumer(local)?);
            let old = std::mem::replace(&mut *built, fresh);
            if old.0.pid != std::process::id() {
                std::mem::forget(old);
            }
        }
        Ok(built.1.clone())
    }

    /// Hands `delivery` to the consumer layer: its settlement, or its turn
    /// to run. The layer's work runs on `local`'s runtime.
    pub fn begin(
        &self,
        local: &Arc<Local>,
        delivery: Delivery,
    ) -> impl Future<Output = Result<Delivered, EngineError>> + Send + 'static {
        let consumer = self.consumer(local);
        let local = Arc::clone(local);
        async move {
            let consumer = consumer?;
            let (turn_tx, mut turn_rx) = oneshot::channel::<Turn>();
            let task = local.spawn(async move {
                let name = consumer.name().to_owned();
                let decision = consumer
                    .process(Arc::new(delivery), move |job| async move {
                        let (respond, answer) = oneshot::channel();
                        let turn = Turn {
                            ctx: job.ctx().clone(),
                            key: job.key().as_str().to_owned(),
                            respond,
                        };
                        if turn_tx.send(turn).is_err() {
                            return Err(unanswered("the adapter stopped waiting for its turn"));
                        }
                        answer.await.unwrap_or_else(|_| {
                            Err(unanswered("the handler ended without an answer"))
                        })
                    })
                    .await;
                Settlement::of(decision, &name)
            });
            let mut settled: SettleFuture = Box::pin(task);
            tokio::select! {
                turn = &mut turn_rx => match turn {
                    Ok(turn) => Ok(Delivered::Turn(DeliveryTurn {
                        context: RunContext::new(Arc::clone(&local), turn.ctx),
                        key: turn.key,
                        respond: Mutex::new(Some(turn.respond)),
                        settled: Mutex::new(Some(settled)),
                    })),
                    Err(_) => settled.await.map(Delivered::Settled),
                },
                done = &mut settled => done.map(Delivered::Settled),
            }
        }
    }
}

fn unanswered(why: &str) -> HandlerFailure {
    HandlerFailure {
        message: why.to_owned(),
        class: FailureClass::Retryable,
    }
}

impl DeliveryTurn {
    /// The run the handler runs under: its fence, lease-lost check, steps.
    pub fn context(&self) -> &RunContext {
        &self.context
    }

    /// The delivery's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Hands over the handler's result and resolves with the
    /// settlement once it is stored: `result` is the JSON, or why the
    /// handler's language could not encode the value, which is recorded
    /// as a terminal failure saying why (the work has run).
    pub fn complete(
        &self,
        result: Result<Vec<u8>, String>,
    ) -> impl Future<Output = Result<Settlement, EngineError>> + Send + 'static {
        let answer = result
            .and_then(|json| String::from_utf8(json).map_err(|e| e.to_string()))
            .and_then(|text| RawValue::from_string(text).map_err(|e| e.to_string()))
            .map_err(|reason| HandlerFailure {
                message: format!("the result cannot be stored as JSON: {reason}"),
                class: FailureClass::Terminal,
            });
        self.settle(answer)
    }

    /// Hands over the handler's failure (a retryable one is retried with
    /// backoff, a terminal one dead-lettered) and resolves with the
    /// settlement.
    pub fn fail(
        &self,
        failure: HandlerFailure,
    ) -> impl Future<Output = Result<Settlement, EngineError>> + Send + 'static {
        self.settle(Err(failure))
    }

    fn settle(
        &self,
        answer: Answer,
    ) -> impl Future<Output = Result<Settlement, EngineError>> + Send + 'static {
        let respond = self.respond.lock().take();
        let settled = self.settled.lock().take();
        async move {
            let (Some(respond), Some(settled)) = (respond, settled) else {
                return Err(EngineError::Config(
                    "the delivery was already finished".to_owned(),
                ));
            };
            // The layer stopped waiting only if its run ended: the
            // settlement says how.
            let _ = respond.send(answer);
            settled.await
        }
    }
}
