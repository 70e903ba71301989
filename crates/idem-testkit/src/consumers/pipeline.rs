//! The outbox between two consumers of one broker (A applies its effect
//! and emits to B; B applies its own), shared by the adapters' pipeline
//! tests: a first-phase link that fails in the two places a producer can
//! die, the effects each hop counts, and the check that every input's
//! effect happened once at each hop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem::outbox::{Message, SendError, SendFuture, Sender};
use idem::store::GetRecord;
use idem::{Key, Record, RecordId, Scope, State};

/// Inputs each pipeline test publishes (each twice).
pub const INPUTS: usize = 30;
/// Messages the first phase's link never sends: A's outcomes are stored
/// and its inputs acked with nothing sent (only the dispatcher can
/// deliver them).
pub const REFUSED: usize = 10;
/// Messages after which the first phase's link never answers: sent, and
/// A dies before it learns so (the same ids are sent again later).
pub const HUNG: usize = 3;

/// The first phase's link in front of a real sender: refuses the first
/// [`REFUSED`] messages every time, sends the next [`HUNG`] and never
/// answers the first time each is sent (the process dies there; a replay
/// of its input that sends it again is another process), then works.
#[derive(Debug)]
pub struct FirstPhase<S> {
    inner: S,
    /// Each message's id, in the order first seen, and whether it was
    /// sent.
    seen: Mutex<Vec<(String, bool)>>,
}

impl<S: Sender> FirstPhase<S> {
    /// In front of `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            seen: Mutex::default(),
        }
    }
}

impl<S: Sender> Sender for FirstPhase<S> {
    fn send<'a>(&'a self, message: &'a Message) -> SendFuture<'a> {
        Box::pin(async move {
            let (n, again) = {
                let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                let n = match seen.iter().position(|(id, _)| id == message.id()) {
                    Some(n) => n,
                    None => {
                        seen.push((message.id().to_owned(), false));
                        seen.len() - 1
                    }
                };
                let again = seen[n].1;
                seen[n].1 |= n >= REFUSED;
                (n, again)
            };
            if n < REFUSED {
                return Err(SendError::Unavailable("the link is down".into()));
            }
            self.inner.send(message).await?;
            if n < REFUSED + HUNG && !again {
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

/// Each application of each input's effect at one hop, by the attempt
/// and fence of the run that applied it (so a failure tells a takeover
/// from two runs of one claim).
#[derive(Debug, Clone, Default)]
pub struct Effects(Arc<Mutex<HashMap<String, Vec<Run>>>>);

/// The run that applied an effect: its attempt and fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The claim's attempt (1 for the first).
    pub attempt: u32,
    /// The claim's fencing number.
    pub fence: Option<u64>,
}

impl Effects {
    /// Notes one application of `input`'s effect by `run`.
    pub fn apply(&self, input: &str, run: Run) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(input.to_owned())
            .or_default()
            .push(run);
    }

    /// The inputs that had an effect.
    pub fn input_keys(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// How many inputs had an effect.
    pub fn inputs(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Waits (a minute at most) until `n` inputs had an effect.
    pub async fn wait_for(&self, n: usize, hop: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.inputs() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for effects at {hop}: {} of {n}",
                self.inputs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Panics unless exactly [`INPUTS`] inputs had an effect, each once.
    pub fn assert_each_once(&self, hop: &str) {
        let effects = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(effects.len(), INPUTS, "inputs with an effect at {hop}");
        let wrong: Vec<_> = effects.iter().filter(|(_, runs)| runs.len() != 1).collect();
        assert!(
            wrong.is_empty(),
            "effects at {hop} not applied exactly once: {wrong:?}"
        );
    }
}

/// Waits (a minute at most) until A is quiet: the record of every input
/// whose effect `effects` counted is completed in `store` (scope
/// `orders`), and no input had its first effect meanwhile. A first phase
/// killed after this has no run in flight: without it, a run killed
/// between its effect and its completion is taken over and applies its
/// effect again, as idem promises for an effect outside a step (at least
/// once), and the test would count it.
pub async fn wait_completed<S: GetRecord>(store: &S, effects: &Effects) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let scope = Scope::new("orders").expect("a valid scope");
    loop {
        let inputs = effects.input_keys();
        for input in &inputs {
            let id = RecordId::new(scope.clone(), Key::new(input).expect("a valid key"));
            loop {
                let record = store.get(&id).await;
                if let Ok(Some(Record {
                    state: State::Completed { .. },
                    ..
                })) = record
                {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "timed out waiting for {input} to complete at A: {record:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if effects.inputs() == inputs.len() {
            return;
        }
    }
}

/// What a hop's handler returns.
pub type HopFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), idem::HandlerError>> + Send>>;

/// The handler of one hop: applies the input's effect in `effects` and,
/// for A (`to` given), sends one message to `to` through the outbox, its
/// payload the input's key; for B (`to` absent) the input is the payload
/// (A's key), the delivery keyed by A's message id.
pub fn hop<M: idem_consumer::Message>(
    effects: &Effects,
    to: Option<String>,
) -> impl Fn(idem_consumer::Job<M>) -> HopFuture + Send + Sync + 'static {
    let effects = effects.clone();
    move |job| {
        let (effects, to) = (effects.clone(), to.clone());
        Box::pin(async move {
            let input = match &to {
                Some(_) => job.key().as_str().to_owned(),
                None => String::from_utf8_lossy(job.payload()).into_owned(),
            };
            let ctx = job.ctx();
            effects.apply(
                &input,
                Run {
                    attempt: ctx.attempt(),
                    fence: ctx.fence(),
                },
            );
            if let Some(to) = to {
                job.ctx().send(Message::new(to, input).header("hop", "a"))?;
            }
            Ok(())
        })
    }
}

/// The executor of a pipeline's consumers: the scenarios' short lease,
/// sending through `sender`.
pub fn executor<S: idem::Store>(store: S, sender: impl Sender) -> idem::Idempotency<S> {
    idem::Idempotency::builder(store)
        .lease(crate::consumers::scenario::LEASE)
        .heartbeat(Duration::from_millis(500))
        .outbox(sender)
        .build()
        .expect("config")
}
