//! A background task that removes expired records in bounded batches, for
//! any store that can [`PurgeExpired`].

use std::future::Future;
use std::time::Duration;

use crate::store::PurgeExpired;

/// Stops the purge task started by [`spawn_purger`] (or the blob sweep
/// of [`spawn_blob_sweeper`](crate::blob::spawn_blob_sweeper)) when
/// dropped.
#[derive(Debug)]
pub struct PurgerHandle {
    task: tokio::task::JoinHandle<()>,
}

impl PurgerHandle {
    pub(crate) fn new(task: tokio::task::JoinHandle<()>) -> Self {
        Self { task }
    }
}

impl Drop for PurgerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a task on the current tokio runtime that awaits `pass()` every
/// `every` (the first at once; a pass that overruns delays the next
/// rather than bunching them): the loop of every background sweep.
pub(crate) fn every<F, Fut>(every: Duration, mut pass: F) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            pass().await;
        }
    })
}

/// Starts a task on the current tokio runtime that awaits `pass()` every
/// `every` (the first at once; a pass that overruns delays the next),
/// stopped when the handle is dropped: a background sweep of your own
/// (the consumers' sweep of parked keys is one).
pub fn spawn_every<F, Fut>(every: Duration, pass: F) -> PurgerHandle
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    PurgerHandle::new(self::every(every, pass))
}

/// Starts a task on the current tokio runtime (the reaper) that, every
/// `every`, purges expired records `batch` at a time until a batch comes
/// back short. No single purge holds the store for long, and between two
/// batches the task waits as long as the last batch took, so it never
/// keeps the store busy more than half the time however large the
/// backlog. Errors are logged and retried at the next tick. The task owns
/// `store` (a clone) and stops when the handle is dropped.
pub fn spawn_purger<S: PurgeExpired + Clone>(
    store: S,
    every: Duration,
    batch: usize,
) -> PurgerHandle {
    let batch = batch.max(1);
    let task = self::every(every, move || {
        let store = store.clone();
        async move {
            loop {
                let started = tokio::time::Instant::now();
                match store.purge_expired(batch).await {
                    Ok(n) if n == batch => tokio::time::sleep(started.elapsed()).await,
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(%error, "purging expired records failed; retrying at the next tick");
                        break;
                    }
                }
            }
        }
    });
    PurgerHandle::new(task)
}
