//! Durable handlers and the completer: runs that finish even when the
//! worker running them dies.
//!
//! [`Idempotency::run`] makes a retry safe, but something has to retry: a
//! broker redelivers, an HTTP client tries again. Work started from inside
//! your own service (a job, an outbox relay, a scheduled task) has no such
//! caller. A [`Durable`] handler is bound to a scope and journals its
//! input with its record before it runs, so that a [`Completer`] — in any
//! process — can find a run whose worker crashed (its lease ran out), take
//! it over and run the same handler again with the same input. Journaled
//! [steps](crate::step) already finished are replayed, not re-run.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use idem::durable::Completer;
//! use idem::{Idempotency, Key, MemoryStore, Scope};
//!
//! let idem = Idempotency::builder(MemoryStore::new()).build()?;
//! let ship = idem.durable(Scope::new("shipments")?, |order: u64, _ctx| async move {
//!     Ok::<_, std::io::Error>(format!("shipped {order}"))
//! })?;
//!
//! // Every process that runs shipments also re-drives the abandoned ones.
//! let _completer = Completer::new().register(&ship).spawn();
//!
//! let shipped = ship.run(&Key::new("order-42")?, 42).await?;
//! assert_eq!(shipped.value(), "shipped 42");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! What the completer does with each abandoned record of a registered
//! scope, a batch at a time:
//!
//! - claims it (a takeover: attempt + 1, a new token and fence);
//! - reads the journaled input and runs the handler under the new lease,
//!   storing its outcome exactly as [`Durable::run`] would (retryable
//!   failures are released with their backoff, the max-attempts rule
//!   applies, [`Park`](crate::step::Park) steps in doubt park the record);
//! - if the record has no journaled input (its worker died between the
//!   claim and the journal write, so the handler never started) or the
//!   input no longer decodes, it releases the record for the next
//!   delivery and says so in the log and metrics.
//!
//! It re-drives at most `batch` records per scope per tick, `concurrency`
//! at a time, so a backlog after an outage drains at a bounded rate.
//! Completers in several processes may run at once: each record is taken
//! over by exactly one of them (the claim decides), and a live lease is
//! never touched. Released records (retryable failures, resolved parked
//! records) are left to their next delivery.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::codec::{Codec, Json};
use crate::executor::{Claimed, ConfigError, Context, Idempotency, Outcome, RunError};
use crate::fingerprint::Fingerprint;
use crate::key::{Key, RecordId, Scope};
use crate::metrics as m;
use crate::record::{Lease, Record, StepBegin};
use crate::step::with_retries;
use crate::store::{BoxFuture, DynStepJournal, FindAbandoned, Store, StoreError};

/// The journal entry holding a durable run's input (JSON). Step names
/// starting with `$` are reserved, so no step can collide with it.
pub const INPUT_STEP: &str = "$input";

type HandlerFn<I, T, E> = dyn Fn(I, Context) -> BoxFuture<'static, Result<T, E>> + Send + Sync;

/// A handler bound to a scope whose runs a [`Completer`] can finish; see
/// the [module docs](self). Cheap to clone.
pub struct Durable<S, I, T, E, C = Json> {
    inner: Arc<Inner<S, I, T, E, C>>,
}

struct Inner<S, I, T, E, C> {
    idem: Idempotency<S, C>,
    journal: Arc<dyn DynStepJournal>,
    scope: Scope,
    handler: Box<HandlerFn<I, T, E>>,
}

impl<S, I, T, E, C> Clone for Durable<S, I, T, E, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S, I, T, E, C> fmt::Debug for Durable<S, I, T, E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Durable")
            .field("scope", &self.inner.scope)
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone, C: Codec + Clone> Idempotency<S, C> {
    /// Binds `handler` to `scope` as a [`Durable`] handler of this
    /// executor. Runs of the scope should all go through it: the
    /// [`Completer`] re-drives every abandoned record of the scope with
    /// this handler.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NoStepJournal`] if the store keeps no step journal
    /// (the input is journaled there).
    pub fn durable<I, T, E, F, Fut>(
        &self,
        scope: Scope,
        handler: F,
    ) -> Result<Durable<S, I, T, E, C>, ConfigError>
    where
        F: Fn(I, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let journal = Arc::clone(self.journal().ok_or(ConfigError::NoStepJournal)?);
        Ok(Durable {
            inner: Arc::new(Inner {
                idem: self.clone(),
                journal,
                scope,
                handler: Box::new(move |input, ctx| Box::pin(handler(input, ctx))),
            }),
        })
    }
}

impl<S, I, T, E, C> Durable<S, I, T, E, C>
where
    S: Store + Clone,
    C: Codec + Clone,
    I: Serialize + DeserializeOwned + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: StdError + Send + Sync + 'static,
{
    /// The scope the handler is bound to.
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// Runs the handler once (in effect) for `key` with `input`, as
    /// [`Idempotency::run`] does, after journaling `input` with the record
    /// so that a [`Completer`] can finish the run if this worker dies.
    ///
    /// The fingerprint is the input's: the same key with a different input
    /// is [`RunError::Mismatch`]. An input that does not encode as JSON or
    /// is over the executor's `max_response_bytes` is [`RunError::Input`],
    /// before anything is claimed.
    pub async fn run(&self, key: &Key, input: I) -> Result<Outcome<T>, RunError<E>> {
        let inner = &*self.inner;
        let idem = &inner.idem;
        let id = idem
            .stored_id(&RecordId::new(inner.scope.clone(), key.clone()))
            .into_owned();
        idem.instrumented(&id, async {
            let bytes = encode_input(&input, idem.max_journaled_bytes())
                .map_err(|reason| RunError::Input { reason })?;
            let params = idem.claim_params(Some(Fingerprint::of_bytes(&bytes)));
            match idem
                .acquire(&id, &params, idem.fails_open(), idem.waits_for_in_flight())
                .await
            {
                Ok(Claimed::Held { lease, sent }) => {
                    self.journal_input(&lease, bytes).await?;
                    idem.execute(&lease, sent, params.fingerprint, |ctx| {
                        (inner.handler)(input, ctx)
                    })
                    .await
                }
                Ok(Claimed::Unguarded) => {
                    idem.unguarded(&id, |ctx| (inner.handler)(input, ctx)).await
                }
                Ok(Claimed::Answered(outcome)) => idem.replay(&id, outcome).await,
                Err(error) => Err(RunError::Store(error)),
            }
        })
        .await
    }

    /// Journals the input under `lease`, unless an earlier attempt did (the
    /// fingerprint guarantees it is the same input). On a store error the
    /// claim is given back, so a retry need not wait for the lease.
    async fn journal_input(&self, lease: &Lease, bytes: Bytes) -> Result<(), RunError<E>> {
        let idem = &self.inner.idem;
        let journal = &self.inner.journal;
        let bytes = idem.at_rest().seal_step(&lease.id, INPUT_STEP, bytes);
        let key = idem.logged_key(&lease.id);
        let finish = || journal.finish_step(lease, INPUT_STEP, bytes.clone());
        let written =
            match with_retries(key, INPUT_STEP, || journal.begin_step(lease, INPUT_STEP)).await {
                Ok(StepBegin::Done(_)) => Ok(()),
                Ok(_) => with_retries(key, INPUT_STEP, finish).await,
                Err(error) => Err(error),
            };
        match written {
            Ok(()) => Ok(()),
            Err(StoreError::LeaseLost) => Err(RunError::LeaseLost),
            Err(error) => {
                if let Err(release) = idem.store().release(lease).await {
                    tracing::warn!(
                        scope = %key.scope(),
                        %key,
                        %release,
                        "could not give back the claim after a journal error"
                    );
                }
                Err(RunError::Store(error))
            }
        }
    }

    /// Takes over one abandoned record, as `listed`, and runs it again with
    /// its journaled input. A record that changed since it was listed
    /// (released by a retryable failure or an operator, finished, deleted,
    /// or its holder alive after all) is left to its next delivery.
    async fn redrive(&self, id: RecordId, listed: Record) -> Redriven {
        let inner = &*self.inner;
        let idem = &inner.idem;
        // A listing can be old by the time its record's turn comes: a
        // claim would take a released record (ignoring its backoff) or make
        // a new one for a key that is gone, so look first. A store that
        // cannot look leaves it to the claim, as before.
        match idem.store().peek(&id).await {
            Ok(Some(now)) if now.state == listed.state => {}
            Ok(_) => return Redriven::Skipped,
            Err(_) => {}
        }
        let params = idem.claim_params(listed.fingerprint);
        let (lease, sent) = match idem.claim_once(&id, &params).await {
            Ok(Claimed::Held { lease, sent }) if lease.takeover => (lease, sent),
            Ok(Claimed::Held { lease, .. }) => {
                // Released or gone between the look and the claim.
                tracing::info!(scope = %id.scope(), key = %idem.logged_key(&id), "completer found the record changed at its claim; giving it back");
                let _ = idem.store().release(&lease).await;
                return Redriven::Skipped;
            }
            // Someone else took it over or finished it first.
            Ok(_) => return Redriven::Skipped,
            Err(error) => {
                tracing::warn!(
                    scope = %id.scope(),
                    key = %idem.logged_key(&id),
                    %error,
                    "completer could not claim an abandoned record"
                );
                return Redriven::Error;
            }
        };
        let input = match self.journaled_input(&lease).await {
            Ok(input) => input,
            Err(why) => {
                tracing::warn!(
                    scope = %id.scope(),
                    key = %idem.logged_key(&id),
                    why,
                    "completer cannot re-drive this record; released for its next delivery"
                );
                return match idem.store().release(&lease).await {
                    Ok(()) => Redriven::Released,
                    Err(_) => Redriven::Error,
                };
            }
        };
        let result = idem
            .instrumented(
                &id,
                idem.execute(&lease, sent, params.fingerprint, |ctx| {
                    (inner.handler)(input, ctx)
                }),
            )
            .await;
        match result {
            Ok(_) => Redriven::Completed,
            Err(RunError::Parked(_)) => Redriven::Parked,
            Err(RunError::Handler { .. } | RunError::Failed(_))
            | Err(RunError::ResponseTooLarge { .. } | RunError::Encode(_)) => Redriven::Failed,
            Err(_) => Redriven::Error,
        }
    }

    /// The input journaled with `lease`'s record, or why there is none to
    /// use.
    async fn journaled_input(&self, lease: &Lease) -> Result<I, &'static str> {
        let journal = &self.inner.journal;
        let key = self.inner.idem.logged_key(&lease.id);
        match with_retries(key, INPUT_STEP, || journal.begin_step(lease, INPUT_STEP)).await {
            Ok(StepBegin::Done(bytes)) => {
                let opened = self
                    .inner
                    .idem
                    .at_rest()
                    .open_step(&lease.id, INPUT_STEP, &bytes)
                    .map_err(|_| "the journaled input does not open with the executor's keyring")?;
                serde_json::from_slice(&opened).map_err(|_| {
                    "the journaled input does not decode into the handler's input type"
                })
            }
            Ok(_) => Err("no input was journaled (the worker died before the handler started)"),
            Err(_) => Err("the journaled input could not be read"),
        }
    }
}

fn encode_input<I: Serialize>(input: &I, limit: usize) -> Result<Bytes, String> {
    let bytes = serde_json::to_vec(input).map_err(|e| e.to_string())?;
    if bytes.len() > limit {
        return Err(format!(
            "{} bytes as JSON exceeds the limit of {limit} bytes",
            bytes.len()
        ));
    }
    Ok(Bytes::from(bytes))
}

/// What the completer did with one abandoned record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Redriven {
    Completed,
    Failed,
    Parked,
    Released,
    Skipped,
    Error,
}

impl Redriven {
    fn label(self) -> &'static str {
        match self {
            Redriven::Completed => "completed",
            Redriven::Failed => "failed",
            Redriven::Parked => "parked",
            Redriven::Released => "released",
            Redriven::Skipped => "skipped",
            Redriven::Error => "error",
        }
    }
}

/// What one [`Completer::sweep`] did, summed over the registered scopes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sweep {
    /// Abandoned records found.
    pub found: usize,
    /// Re-driven to completion.
    pub completed: usize,
    /// Re-driven and failed (retryable, terminal, or out of attempts).
    pub failed: usize,
    /// Re-driven and parked for reconciliation.
    pub parked: usize,
    /// Released for their next delivery: no usable journaled input.
    pub released: usize,
    /// Taken over or finished by someone else first.
    pub skipped: usize,
    /// Store errors, lost leases and panicking handlers; retried on a
    /// later sweep.
    pub errors: usize,
}

impl Sweep {
    fn add(&mut self, r: Redriven) {
        let slot = match r {
            Redriven::Completed => &mut self.completed,
            Redriven::Failed => &mut self.failed,
            Redriven::Parked => &mut self.parked,
            Redriven::Released => &mut self.released,
            Redriven::Skipped => &mut self.skipped,
            Redriven::Error => &mut self.errors,
        };
        *slot += 1;
        m::count(m::REDRIVEN, &[("result", r.label())]);
    }
}

/// Sums sweeps, field by field.
impl std::ops::AddAssign for Sweep {
    fn add_assign(&mut self, other: Sweep) {
        self.found += other.found;
        self.completed += other.completed;
        self.failed += other.failed;
        self.parked += other.parked;
        self.released += other.released;
        self.skipped += other.skipped;
        self.errors += other.errors;
    }
}

/// A registered handler, as the completer drives it.
trait Redrive: Send + Sync {
    fn scope(&self) -> &Scope;
    fn sweep(&self, batch: usize, concurrency: usize) -> BoxFuture<'_, Sweep>;
}

impl<S, I, T, E, C> Redrive for Durable<S, I, T, E, C>
where
    S: FindAbandoned + Clone,
    C: Codec + Clone,
    I: Serialize + DeserializeOwned + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: StdError + Send + Sync + 'static,
{
    fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    fn sweep(&self, batch: usize, concurrency: usize) -> BoxFuture<'_, Sweep> {
        Box::pin(async move {
            let mut sweep = Sweep::default();
            let found = match self.inner.idem.store().abandoned(self.scope(), batch).await {
                Ok(found) => found,
                Err(error) => {
                    tracing::warn!(%error, scope = %self.scope(), "completer could not list abandoned records");
                    sweep.errors += 1;
                    return sweep;
                }
            };
            sweep.found = found.len();
            let mut running = JoinSet::new();
            for (id, record) in found {
                if running.len() >= concurrency {
                    if let Some(done) = running.join_next().await {
                        sweep.add(joined(done));
                    }
                }
                let me = self.clone();
                running.spawn(async move { me.redrive(id, record).await });
            }
            while let Some(done) = running.join_next().await {
                sweep.add(joined(done));
            }
            sweep
        })
    }
}

fn joined(done: Result<Redriven, tokio::task::JoinError>) -> Redriven {
    done.unwrap_or_else(|error| {
        tracing::error!(%error, "a re-driven handler panicked; its lease will run out again");
        Redriven::Error
    })
}

/// Re-drives the abandoned records of [`Durable`] handlers; see the
/// [module docs](self).
///
/// Defaults: a sweep every 5 s, at most 100 records per scope per sweep,
/// 4 re-driven at a time.
pub struct Completer {
    handlers: Vec<Arc<dyn Redrive>>,
    every: Duration,
    batch: usize,
    concurrency: usize,
}

impl fmt::Debug for Completer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scopes: Vec<&Scope> = self.handlers.iter().map(|h| h.scope()).collect();
        f.debug_struct("Completer")
            .field("scopes", &scopes)
            .field("every", &self.every)
            .field("batch", &self.batch)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

impl Default for Completer {
    fn default() -> Self {
        Self::new()
    }
}

impl Completer {
    /// A completer with no handlers and the default pace.
    pub fn new() -> Self {
        Self {
            handlers: Vec::new(),
            every: Duration::from_secs(5),
            batch: 100,
            concurrency: 4,
        }
    }

    /// Re-drives the abandoned records of `durable`'s scope with it.
    pub fn register<S, I, T, E, C>(mut self, durable: &Durable<S, I, T, E, C>) -> Self
    where
        S: FindAbandoned + Clone,
        C: Codec + Clone,
        I: Serialize + DeserializeOwned + Send + 'static,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
    {
        self.handlers.push(Arc::new(durable.clone()));
        self
    }

    /// How often [`Self::spawn`]'s task sweeps.
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(1));
        self
    }

    /// At most this many records per scope per sweep (at least 1).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// At most this many records re-driven at once (at least 1).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// One pass over every registered scope: finds up to `batch`
    /// abandoned records of each and re-drives them. Must run on a tokio
    /// runtime (the re-drives are tasks of their own).
    pub async fn sweep(&self) -> Sweep {
        let mut total = Sweep::default();
        for handler in &self.handlers {
            total += handler.sweep(self.batch, self.concurrency).await;
        }
        if total.found > 0 {
            tracing::info!(?total, "completer sweep");
        }
        total
    }

    /// Starts a task on the current tokio runtime that sweeps every
    /// `every`. Dropping the handle stops it; a re-drive cut off that way
    /// is left as a crash would leave it, for a later sweep.
    pub fn spawn(self) -> CompleterHandle {
        let every = self.every;
        let completer = std::sync::Arc::new(self);
        let task = crate::purger::every(every, move || {
            let completer = std::sync::Arc::clone(&completer);
            async move {
                completer.sweep().await;
            }
        });
        CompleterHandle { task }
    }
}

/// Stops the task started by [`Completer::spawn`] when dropped.
#[derive(Debug)]
pub struct CompleterHandle {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CompleterHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversize_and_unencodable_inputs_are_refused_with_the_reason() {
        assert_eq!(encode_input(&"ab", 4).expect("fits"), Bytes::from("\"ab\""));
        let too_big = encode_input(&"abcd", 4).expect_err("6 bytes > 4");
        assert!(
            too_big.contains("6 bytes") && too_big.contains("limit of 4"),
            "{too_big}"
        );
        let map: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(
            encode_input(&map, 100).is_err(),
            "JSON keys must be strings"
        );
    }

    #[test]
    fn sweeps_sum_up() {
        let mut a = Sweep::default();
        a.add(Redriven::Completed);
        a.add(Redriven::Released);
        let mut b = Sweep {
            found: 2,
            ..Sweep::default()
        };
        b.add(Redriven::Error);
        b += a;
        assert_eq!((b.found, b.completed, b.released, b.errors), (2, 1, 1, 1));
    }
}
