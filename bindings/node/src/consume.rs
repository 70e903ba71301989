//! `ConsumerGuard` and `DeliveryTurn`: the broker consumer of
//! [`idem_engine::consume`] for the package's SQS adapter, which hands
//! over messages as `{ payload, headers, messageId, deliveryCount }` and
//! gets back a settlement or the message's turn to run.

use std::sync::Arc;

use idem_engine::consume::{ConsumeOptions, ConsumerGuard as Guard, Delivered, Delivery};
use idem_engine::consume::{DeliveryTurn as Turn, Settlement as Settled};
use idem_engine::input::{self, Unit};
use idem_engine::{result_of, HandlerFailure, Local};
use napi::bindgen_prelude::{Buffer, Either, PromiseRaw};
use napi::Env;
use napi_derive::napi;

use crate::context::Context;
use crate::engine::Engine;
use crate::errors::to_js;
use crate::promise::promise;

/// How the consumer runs its deliveries; unset: the consumer layer's
/// defaults.
#[napi(object)]
pub struct ConsumerOptions {
    /// The keys' scope.
    pub scope: String,
    /// Key sources, tried in order: "header:NAME", "message_id", a JSON
    /// pointer ("/orderId"), "content_hash".
    pub keys: Option<Vec<String>>,
    /// Whether a key reused with another payload is dead-lettered.
    pub fingerprint: Option<bool>,
    /// The consumer's name in dead-letter attributes.
    pub name: Option<String>,
    /// The shortest delay before a retried delivery, ms.
    pub min_retry_delay_ms: Option<f64>,
    /// The longest delay before a retried delivery, ms.
    pub max_retry_delay_ms: Option<f64>,
}

/// A message as the adapter hands it over.
#[napi(object)]
pub struct Message {
    /// The body.
    pub payload: Buffer,
    /// Attribute names and values, alternating.
    pub headers: Vec<String>,
    /// The broker's message id.
    pub message_id: Option<String>,
    /// How many times it was delivered, this one included.
    pub delivery_count: Option<u32>,
}

/// What the consumer layer decided for a message.
#[napi(object)]
pub struct Settlement {
    /// "ack", "retry" or "dead_letter".
    pub action: String,
    /// For a retry, the delay before the next delivery, ms.
    pub after_ms: Option<f64>,
    /// Why (a retry's cause, a dead-letter's reason).
    pub reason: Option<String>,
    /// For an ack, whether the message was a duplicate of a completed one.
    pub replayed: bool,
    /// The message's key, when one could be read.
    pub key: Option<String>,
    /// The attributes a dead-letter copy carries, names and values
    /// alternating.
    pub dead_letter_headers: Vec<String>,
}

/// The consumer over an engine; see the package's `SqsConsumer`.
#[napi]
pub struct ConsumerGuard {
    engine: Arc<idem_engine::Engine>,
    guard: Arc<Guard>,
}

/// A message's turn to run: its run's `context`, and `complete` or `fail`.
#[napi]
pub struct DeliveryTurn {
    local: Arc<Local>,
    turn: Arc<Turn>,
}

fn settlement(settled: Settled) -> Settlement {
    Settlement {
        action: settled.action.as_str().to_owned(),
        after_ms: settled.after.map(|d| d.as_secs_f64() * 1000.0),
        reason: settled.reason,
        replayed: settled.replayed,
        key: settled.key,
        dead_letter_headers: settled
            .dead_letter_headers
            .into_iter()
            .flat_map(|(name, value)| [name, value])
            .collect(),
    }
}

fn pairs(flat: Vec<String>) -> Vec<(String, String)> {
    let mut lines = Vec::with_capacity(flat.len() / 2);
    let mut flat = flat.into_iter();
    while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
        lines.push((name, value));
    }
    lines
}

#[napi]
impl ConsumerGuard {
    /// The consumer over `engine`'s store.
    #[napi(constructor)]
    pub fn new(engine: &Engine, options: ConsumerOptions) -> napi::Result<Self> {
        let millis = |name, ms| input::duration(name, ms, Unit::Millis).map_err(to_js);
        let options = ConsumeOptions {
            scope: options.scope,
            keys: options.keys,
            fingerprint: options.fingerprint,
            name: options.name,
            min_retry_delay: millis("minRetryDelayMs", options.min_retry_delay_ms)?,
            max_retry_delay: millis("maxRetryDelayMs", options.max_retry_delay_ms)?,
        };
        let engine = engine.shared();
        let local = engine.here().map_err(to_js)?;
        let guard = Guard::new(&local, options).map_err(to_js)?;
        Ok(Self {
            engine,
            guard: Arc::new(guard),
        })
    }

    /// Hands a message over: its settlement, or a `DeliveryTurn` to run
    /// the handler in.
    #[napi]
    pub fn begin<'env>(
        &self,
        env: &'env Env,
        message: Message,
    ) -> napi::Result<PromiseRaw<'env, Either<Settlement, DeliveryTurn>>> {
        let local = self.engine.here().map_err(to_js)?;
        let work = self.guard.begin(
            &local,
            Delivery {
                payload: message.payload.to_vec(),
                headers: pairs(message.headers),
                message_id: message.message_id,
                delivery_count: message.delivery_count,
            },
        );
        let held = Arc::clone(&local);
        promise(env, &local, work, move |delivered| {
            Ok(match delivered {
                Delivered::Settled(settled) => Either::A(settlement(settled)),
                Delivered::Turn(turn) => Either::B(DeliveryTurn {
                    local: held,
                    turn: Arc::new(turn),
                }),
            })
        })
    }
}

#[napi]
impl DeliveryTurn {
    /// The run the handler runs under.
    #[napi(getter)]
    pub fn context(&self) -> Context {
        Context::new(self.turn.context().clone())
    }

    /// The message's key.
    #[napi(getter)]
    pub fn key(&self) -> String {
        self.turn.key().to_owned()
    }

    /// Stores `result` (JSON), or records `unencodable` (why the value is
    /// not JSON) as a terminal failure; resolves with the settlement.
    #[napi]
    pub fn complete<'env>(
        &self,
        env: &'env Env,
        result: Option<String>,
        unencodable: Option<String>,
    ) -> napi::Result<PromiseRaw<'env, Settlement>> {
        let work = self
            .turn
            .complete(result_of(result.map(String::into_bytes), unencodable));
        promise(env, &self.local, work, |settled| Ok(settlement(settled)))
    }

    /// Records the handler's failure ("retryable", "terminal" or
    /// "unknown"); resolves with the settlement.
    #[napi]
    pub fn fail<'env>(
        &self,
        env: &'env Env,
        message: String,
        failure_class: String,
    ) -> napi::Result<PromiseRaw<'env, Settlement>> {
        let failure = HandlerFailure::named(message, &failure_class).map_err(to_js)?;
        let work = self.turn.fail(failure);
        promise(env, &self.local, work, |settled| Ok(settlement(settled)))
    }
}
