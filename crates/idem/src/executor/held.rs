//! Runs whose work is not a closure: [`Idempotency::begin`] claims and
//! hands back a [`HeldRun`] that holds the lease (its heartbeat on a task
//! of its own) until the work ends it with [`HeldRun::complete`],
//! [`HeldRun::fail`] or [`HeldRun::release`]. The closure form
//! ([`Idempotency::run`]) opens and closes its runs the same way; this
//! form is for work driven from elsewhere: another language's handler, a
//! request answered across calls.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::task::JoinHandle;

use super::claim::{unguarded_context, Claimed};
use super::{Context, Idempotency, Outcome, RunError};
use crate::codec::{Codec, Json};
use crate::fingerprint::Fingerprint;
use crate::key::RecordId;
use crate::metrics as m;
use crate::record::Lease;
use crate::store::{Store, StoreError};

/// What [`Idempotency::begin`] found: a run to do, or the answer a
/// duplicate gets.
pub enum Begun<T, S: Store, C: Codec = Json> {
    /// The key is this caller's to run: do the work, then end the run.
    Held(Box<HeldRun<S, C>>),
    /// The key was run before: its stored response, replayed.
    Replayed(T),
}

impl<T: fmt::Debug, S: Store, C: Codec> fmt::Debug for Begun<T, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begun::Held(run) => f.debug_tuple("Held").field(run).finish(),
            Begun::Replayed(value) => f.debug_tuple("Replayed").field(value).finish(),
        }
    }
}

/// A run in progress whose lease this value holds: a heartbeat on a task
/// of its own extends it until the run is ended. Read the lease's state
/// and run steps through [`context`](Self::context); end the run with
/// [`complete`](Self::complete), [`fail`](Self::fail) or
/// [`release`](Self::release).
///
/// Dropping it without ending the run stops the heartbeat and leaves the
/// record as a crash would: the lease runs out and the key is taken over
/// (docs/design.md §5.4).
pub struct HeldRun<S: Store, C: Codec = Json> {
    idem: Idempotency<S, C>,
    /// `None` when running unguarded (fail-open with the store down).
    lease: Option<Lease>,
    fingerprint: Option<Fingerprint>,
    ctx: Context,
    beat: Option<JoinHandle<()>>,
}

impl<S: Store, C: Codec> fmt::Debug for HeldRun<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldRun")
            .field("lease", &self.lease)
            .field("lease_lost", &self.ctx.is_lease_lost())
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone, C: Codec + Clone> Idempotency<S, C> {
    /// Claims `id` for work that ends the run itself, waiting up to `wait`
    /// for an in-flight duplicate (`None`: the executor's
    /// [`wait_for_in_flight`](crate::IdempotencyBuilder::wait_for_in_flight)).
    /// Answers as [`run`](Self::run) does: a stored response is
    /// [`Begun::Replayed`]; a stored failure, a live claim elsewhere, a
    /// fingerprint mismatch or the store down (fail-closed) are the same
    /// [`RunError`]s. Otherwise the lease is held by the [`HeldRun`]
    /// returned, whose heartbeat runs on the current Tokio runtime.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use idem::{Begun, Idempotency, MemoryStore, RecordId, RunError};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new()).build()?;
    /// let id = RecordId::parse("payments", "order-7")?;
    /// let Begun::Held(run) = idem.begin::<String, std::io::Error>(&id, None, None).await? else {
    ///     panic!("the first claim runs")
    /// };
    /// let fence = run.context().checked_fence()?;
    /// let receipt = format!("charged under fence {fence}");
    /// run.complete::<_, std::io::Error>(receipt).await?;
    ///
    /// let again = idem.begin::<String, std::io::Error>(&id, None, None).await?;
    /// assert!(matches!(again, Begun::Replayed(r) if r == "charged under fence 1"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn begin<T, E>(
        &self,
        id: &RecordId,
        fingerprint: Option<Fingerprint>,
        wait: Option<Duration>,
    ) -> Result<Begun<T, S, C>, RunError<E>>
    where
        T: DeserializeOwned,
    {
        let id = &*self.stored_id(id);
        let params = self.claim_params(fingerprint);
        let wait = wait.or(self.config.wait_for_in_flight);
        let claimed = self
            .acquire(id, &params, self.config.fail_open, wait)
            .await
            .map_err(RunError::Store)?;
        let (lease, sent) = match claimed {
            Claimed::Held { lease, sent } => (lease, sent),
            Claimed::Unguarded => {
                return Ok(Begun::Held(Box::new(HeldRun {
                    idem: self.clone(),
                    lease: None,
                    fingerprint,
                    ctx: unguarded_context(id, self.config.outbox.is_some()),
                    beat: None,
                })));
            }
            Claimed::Answered(outcome) => {
                return match self.replay(id, outcome).await? {
                    Outcome::Replayed { value } => Ok(Begun::Replayed(value)),
                    _ => unreachable!("a claim not acquired is answered as a replay or an error"),
                };
            }
        };
        let (ctx, held_tx) = self.open(&lease, sent).await?;
        let beat = {
            let idem = self.clone();
            let lease = lease.clone();
            tokio::spawn(async move { match idem.heartbeat(&lease, sent, held_tx).await {} })
        };
        Ok(Begun::Held(Box::new(HeldRun {
            idem: self.clone(),
            lease: Some(lease),
            fingerprint,
            ctx,
            beat: Some(beat),
        })))
    }
}

impl<S: Store, C: Codec> HeldRun<S, C> {
    /// What the work is told about its run: the fence, whether the lease
    /// is lost (read from the heartbeat's confirmed deadline and the
    /// clock), and its journaled steps.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The lease held, or `None` when running unguarded (fail-open).
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Stops the heartbeat: the run is ending.
    fn stop(&mut self) {
        if let Some(beat) = self.beat.take() {
            beat.abort();
        }
    }

    /// Ends the run with the work's response: stored (retried while the
    /// store is briefly away, for up to a lease) and answered to every
    /// duplicate from now on, as [`Idempotency::run`] does with a
    /// handler's `Ok`.
    pub async fn complete<T, E>(mut self, value: T) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize,
        E: StdError + Send + Sync + 'static,
    {
        self.stop();
        self.end(Ok(value)).await
    }

    /// Ends the run with the work's error, classified by the executor's
    /// classifier (a [`Terminal`](crate::Terminal) in its sources is
    /// terminal) and recorded, as [`Idempotency::run`] does with a
    /// handler's `Err`. Returns the [`RunError`] `run` would have.
    pub async fn fail<E>(mut self, error: E) -> RunError<E>
    where
        E: StdError + Send + Sync + 'static,
    {
        self.stop();
        match self.end::<(), E>(Err(error)).await {
            Err(error) => error,
            Ok(_) => unreachable!("a failed run ends in an error"),
        }
    }

    async fn end<T, E>(&self, result: Result<T, E>) -> Result<Outcome<T>, RunError<E>>
    where
        T: Serialize,
        E: StdError + Send + Sync + 'static,
    {
        let Some(lease) = &self.lease else {
            let messages = self.ctx.outgoing.take();
            return match result {
                Ok(value) => {
                    self.idem.dispatch_unguarded(messages).await;
                    Ok(Outcome::Unguarded { value })
                }
                Err(error) => Err(self.idem.unguarded_failure(error)),
            };
        };
        self.idem
            .close(
                lease,
                self.fingerprint,
                &self.ctx.steps,
                &self.ctx.outgoing,
                result,
            )
            .await
    }

    /// Ends the run with nothing recorded: the key is free at once, for
    /// work that found it had not acted (it could not start, its input is
    /// not ready). The next claim runs it.
    pub async fn release(mut self) -> Result<(), StoreError> {
        self.stop();
        // Nothing was recorded, so nothing is sent: messages held so far
        // are dropped, and a later send is refused as after any end.
        drop(self.ctx.outgoing.take());
        let Some(lease) = &self.lease else {
            return Ok(());
        };
        m::timed(m::OP_RELEASE, self.idem.store.release(lease)).await
    }
}

impl<S: Store, C: Codec> Drop for HeldRun<S, C> {
    fn drop(&mut self) {
        self.stop();
    }
}
