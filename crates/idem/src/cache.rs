//! A cache tier: serve replays of completed records from a fast store in
//! front of the system of record.
//!
//! [`Cached`] wraps a system of record (PostgreSQL, say) and a
//! [`ReplayCache`] (an in-process [`LruCache`], or Redis through
//! `idem-redis`). Its rules keep every guarantee of the system of record:
//!
//! - **Claims and every write go to the system of record.** Only the
//!   answer "completed, here is the response" is ever served from the
//!   cache; an in-progress, failed or released record is never cached.
//! - **Never past expiry.** An entry is cached for the time the system of
//!   record says the record has left ([`RecordTtl`], by the store's own
//!   clock), less the time that question took and a safety margin, and at
//!   most [`CachedBuilder::max_ttl`]. No clocks are compared across
//!   machines. The question names the response just read: a record
//!   deleted and claimed again in between (a new run) has no time left for
//!   it, and nothing is cached.
//! - **Fingerprints still bind.** A cached replay is served only to a
//!   claim with the same fingerprint; any other claim goes to the system
//!   of record, which answers `Mismatch`.
//! - **A broken cache is a slow cache.** Cache errors are logged and
//!   counted; the claim then goes to the system of record.
//!
//! The executor keeps replays of the runs it completed itself in memory by
//! default ([`IdempotencyBuilder::replay_cache_bytes`](crate::IdempotencyBuilder::replay_cache_bytes));
//! [`Cached`] adds replays of records completed elsewhere, for stores that
//! can say how long a record has left.
//!
//! A record deleted by an admin through the [`Cached`] store leaves the
//! cache at once. A delete made elsewhere (another process with its own
//! in-process cache, or straight on the system of record) is seen once the
//! entry's TTL runs out: keep `max_ttl` short when that matters.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::cache::{Cached, LruCache};
//! use idem::{Idempotency, MemoryStore};
//!
//! let store = Cached::new(MemoryStore::new(), LruCache::new(10_000));
//! let idem = Idempotency::builder(store).build()?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::fingerprint::Fingerprint;
use crate::key::{RecordId, Scope};
use crate::record::{
    ClaimOutcome, ClaimParams, Failure, Lease, Record, Resolution, Resolved, StepBegin, StepEntry,
};
use crate::store::{
    ClaimMany, CompleteMany, Completion, DeleteRecord, FindAbandoned, GetRecord, ListPage,
    ListQuery, ListRecords, PurgeExpired, RecordTtl, StepJournal, Store, StoreError,
};

/// Cache hits: replays served without asking the system of record.
pub const CACHE_HITS: &str = "idem_replay_cache_hits_total";
/// Cache misses: claims that went to the system of record.
pub const CACHE_MISSES: &str = "idem_replay_cache_misses_total";
/// Cache errors: the cache failed and was bypassed.
pub const CACHE_ERRORS: &str = "idem_replay_cache_errors_total";

/// The default longest time an entry is cached.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(60);
/// The default margin taken off every entry's time to live.
pub const DEFAULT_SAFETY_MARGIN: Duration = Duration::from_millis(100);

/// A completed record's replay, as cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedReplay {
    /// The record's fingerprint: only claims with the same one are served.
    pub fingerprint: Option<Fingerprint>,
    /// The stored response.
    pub response: Bytes,
}

impl CachedReplay {
    /// The bytes a networked cache stores: a flag, the fingerprint if
    /// any, then the response.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(33 + self.response.len());
        match &self.fingerprint {
            Some(fp) => {
                out.push(1);
                out.extend_from_slice(fp.as_bytes());
            }
            None => out.push(0),
        }
        out.extend_from_slice(&self.response);
        out
    }

    /// Reads [`encode`](Self::encode)'s output; `None` if malformed.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (&flag, rest) = bytes.split_first()?;
        let (fingerprint, response) = match flag {
            0 => (None, rest),
            1 if rest.len() >= 32 => {
                let (fp, response) = rest.split_at(32);
                (
                    Some(Fingerprint::from_digest(fp.try_into().ok()?)),
                    response,
                )
            }
            _ => return None,
        };
        Some(Self {
            fingerprint,
            response: Bytes::copy_from_slice(response),
        })
    }
}

/// A fast store of completed replays, in front of a system of record.
/// Implementations only hold what they are given, for at most `ttl`.
pub trait ReplayCache: Send + Sync + 'static {
    /// The cached replay of `id`, if any and not past its time to live.
    fn get(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<CachedReplay>, StoreError>> + Send;

    /// Caches `replay` for at most `ttl`.
    fn put(
        &self,
        id: &RecordId,
        replay: CachedReplay,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Forgets `id`.
    fn remove(&self, id: &RecordId) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// An in-process cache of at most `capacity` replays, least recently used
/// evicted first, with each entry's deadline on its own [`Clock`].
#[derive(Debug)]
pub struct LruCache<C: Clock = SystemClock> {
    entries: Mutex<lru::LruCache<RecordId, (CachedReplay, Timestamp)>>,
    clock: C,
}

impl LruCache<SystemClock> {
    /// A cache of at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Self::with_clock(capacity, SystemClock)
    }
}

impl<C: Clock> LruCache<C> {
    /// A cache reading time from `clock` (a manual clock in tests).
    pub fn with_clock(capacity: usize, clock: C) -> Self {
        Self {
            entries: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
            )),
            clock,
        }
    }

    /// How many entries it holds (expired ones included until touched).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<C: Clock> ReplayCache for LruCache<C> {
    async fn get(&self, id: &RecordId) -> Result<Option<CachedReplay>, StoreError> {
        // A hit finishes at once: take part in tokio's cooperative budget,
        // so a caller looping over hits still lets other tasks run.
        tokio::task::coop::consume_budget().await;
        let now = self.clock.now();
        let mut entries = self.entries.lock();
        match entries.get(id) {
            Some((replay, until)) if now < *until => Ok(Some(replay.clone())),
            Some(_) => {
                entries.pop(id);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn put(
        &self,
        id: &RecordId,
        replay: CachedReplay,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let until = self.clock.now().saturating_add(ttl);
        self.entries.lock().put(id.clone(), (replay, until));
        Ok(())
    }

    async fn remove(&self, id: &RecordId) -> Result<(), StoreError> {
        self.entries.lock().pop(id);
        Ok(())
    }
}

/// Sets up a [`Cached`] store: from [`Cached::builder`].
#[derive(Debug)]
pub struct CachedBuilder<S, R> {
    store: S,
    cache: R,
    max_ttl: Duration,
    margin: Duration,
}

impl<S, R> CachedBuilder<S, R> {
    /// The longest an entry is cached ([`DEFAULT_MAX_TTL`]): also how long
    /// a delete made outside this store may go unseen.
    pub fn max_ttl(mut self, ttl: Duration) -> Self {
        self.max_ttl = ttl;
        self
    }

    /// Taken off every entry's time to live ([`DEFAULT_SAFETY_MARGIN`]),
    /// for the time it takes to write the entry to a networked cache.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// The store.
    pub fn build(self) -> Cached<S, R> {
        Cached {
            store: self.store,
            cache: self.cache,
            max_ttl: self.max_ttl,
            margin: self.margin,
        }
    }
}

/// A system of record `S` with completed replays served from `R` (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct Cached<S, R> {
    store: S,
    cache: R,
    max_ttl: Duration,
    margin: Duration,
}

impl<S: RecordTtl, R: ReplayCache> Cached<S, R> {
    /// `store` with replays cached in `cache`, with the defaults.
    pub fn new(store: S, cache: R) -> Self {
        Self::builder(store, cache).build()
    }

    /// A builder, to set the TTL bounds.
    pub fn builder(store: S, cache: R) -> CachedBuilder<S, R> {
        CachedBuilder {
            store,
            cache,
            max_ttl: DEFAULT_MAX_TTL,
            margin: DEFAULT_SAFETY_MARGIN,
        }
    }

    /// The system of record.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The cache.
    pub fn cache(&self) -> &R {
        &self.cache
    }

    /// A cached replay for a claim with `fingerprint`, if there is one.
    async fn cached(&self, id: &RecordId, fingerprint: Option<Fingerprint>) -> Option<Bytes> {
        match self.cache.get(id).await {
            Ok(Some(replay)) if replay.fingerprint == fingerprint => {
                metrics::counter!(CACHE_HITS).increment(1);
                Some(replay.response)
            }
            Ok(_) => {
                metrics::counter!(CACHE_MISSES).increment(1);
                None
            }
            Err(e) => {
                metrics::counter!(CACHE_ERRORS).increment(1);
                tracing::warn!(error = %e, "replay cache unavailable; asking the store");
                None
            }
        }
    }

    /// Caches a completed replay for the time the store says it has left.
    async fn fill(&self, id: &RecordId, fingerprint: Option<Fingerprint>, response: &Bytes) {
        let asked = Instant::now();
        // Tied to the response: a record deleted and claimed again since
        // it was read answers `None`, and is not cached.
        let left = match self.store.ttl(id, response).await {
            Ok(Some(left)) => left,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "no TTL for the replay; not caching it");
                return;
            }
        };
        let ttl = left
            .saturating_sub(asked.elapsed())
            .saturating_sub(self.margin)
            .min(self.max_ttl);
        if ttl.is_zero() {
            return;
        }
        let replay = CachedReplay {
            fingerprint,
            response: response.clone(),
        };
        if let Err(e) = self.cache.put(id, replay, ttl).await {
            metrics::counter!(CACHE_ERRORS).increment(1);
            tracing::warn!(error = %e, "could not cache a replay");
        }
    }
}

impl<S: RecordTtl, R: ReplayCache> Store for Cached<S, R> {
    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        if let Some(response) = self.cached(id, params.fingerprint).await {
            return Ok(ClaimOutcome::Completed(response));
        }
        let outcome = self.store.claim(id, params).await?;
        if let ClaimOutcome::Completed(response) = &outcome {
            self.fill(id, params.fingerprint, response).await;
        }
        Ok(outcome)
    }

    fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.complete(lease, response, retention)
    }

    fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.fail(lease, failure, retention)
    }

    fn extend(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<Timestamp, StoreError>> + Send {
        self.store.extend(lease, duration)
    }

    fn release(&self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.release(lease)
    }

    fn wait_for_change(&self, id: &RecordId, timeout: Duration) -> impl Future<Output = ()> + Send {
        self.store.wait_for_change(id, timeout)
    }

    /// The inner store's record, never the cache's copy.
    fn peek(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<crate::Record>, StoreError>> + Send {
        self.store.peek(id)
    }

    /// Steps are written by lease holders only, never cached: the inner
    /// store's journal.
    fn step_journal(&self) -> Option<std::sync::Arc<dyn crate::store::DynStepJournal>> {
        self.store.step_journal()
    }

    /// Marks are written with completions, by the inner store.
    fn pending_sends(&self) -> Option<std::sync::Arc<dyn crate::store::DynPendingSends>> {
        self.store.pending_sends()
    }

    fn local_now(&self) -> Option<Timestamp> {
        self.store.local_now()
    }

    fn keeps_bytes(&self) -> bool {
        self.store.keeps_bytes()
    }

    fn sends_messages(&self) -> bool {
        self.store.sends_messages()
    }

    fn max_stored_bytes(&self) -> Option<usize> {
        self.store.max_stored_bytes()
    }
}

/// Only completed records are cached, and a resolution releases a parked
/// (failed) one: every call goes to the inner store.
impl<S: RecordTtl + StepJournal, R: ReplayCache> StepJournal for Cached<S, R> {
    fn begin_step(
        &self,
        lease: &Lease,
        step: &str,
    ) -> impl Future<Output = Result<StepBegin, StoreError>> + Send {
        self.store.begin_step(lease, step)
    }

    fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.store.finish_step(lease, step, result)
    }

    fn steps(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Vec<StepEntry>, StoreError>> + Send {
        self.store.steps(id)
    }

    fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> impl Future<Output = Result<Resolved, StoreError>> + Send {
        self.store.resolve_step(id, step, resolution)
    }
}

impl<S: RecordTtl + GetRecord, R: ReplayCache> GetRecord for Cached<S, R> {
    fn get(
        &self,
        id: &RecordId,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send {
        self.store.get(id)
    }
}

impl<S: RecordTtl, R: ReplayCache> RecordTtl for Cached<S, R> {
    fn ttl(
        &self,
        id: &RecordId,
        response: &[u8],
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        self.store.ttl(id, response)
    }
}

impl<S: RecordTtl + DeleteRecord, R: ReplayCache> DeleteRecord for Cached<S, R> {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let deleted = self.store.delete(id).await?;
        self.cache.remove(id).await?;
        Ok(deleted)
    }
}

impl<S: RecordTtl + ListRecords, R: ReplayCache> ListRecords for Cached<S, R> {
    fn list(&self, query: &ListQuery) -> impl Future<Output = Result<ListPage, StoreError>> + Send {
        self.store.list(query)
    }
}

impl<S: RecordTtl + PurgeExpired, R: ReplayCache> PurgeExpired for Cached<S, R> {
    fn purge_expired(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<usize, StoreError>> + Send {
        self.store.purge_expired(limit)
    }
}

impl<S: RecordTtl + FindAbandoned, R: ReplayCache> FindAbandoned for Cached<S, R> {
    fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(RecordId, Record)>, StoreError>> + Send {
        self.store.abandoned(scope, limit)
    }
}

impl<S: RecordTtl + ClaimMany, R: ReplayCache> ClaimMany for Cached<S, R> {
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        let mut results: Vec<Option<Result<ClaimOutcome, StoreError>>> = Vec::new();
        let mut misses = Vec::new();
        for (i, (id, params)) in claims.iter().enumerate() {
            match self.cached(id, params.fingerprint).await {
                Some(response) => results.push(Some(Ok(ClaimOutcome::Completed(response)))),
                None => {
                    results.push(None);
                    misses.push(i);
                }
            }
        }
        let asked: Vec<(RecordId, ClaimParams)> =
            misses.iter().map(|&i| claims[i].clone()).collect();
        let answers = self.store.claim_many(&asked).await?;
        for (&i, answer) in misses.iter().zip(answers) {
            if let Ok(ClaimOutcome::Completed(response)) = &answer {
                self.fill(&claims[i].0, claims[i].1.fingerprint, response)
                    .await;
            }
            results[i] = Some(answer);
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(StoreError::Backend("claim missing from batch".into())))
            })
            .collect())
    }
}

impl<S: RecordTtl + CompleteMany, R: ReplayCache> CompleteMany for Cached<S, R> {
    fn complete_many(
        &self,
        completions: &[Completion],
    ) -> impl Future<Output = Result<Vec<Result<(), StoreError>>, StoreError>> + Send {
        self.store.complete_many(completions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_round_trip_through_their_encoding() {
        for fingerprint in [None, Some(Fingerprint::of_bytes(b"x"))] {
            let replay = CachedReplay {
                fingerprint,
                response: Bytes::from_static(b"\0body\xff"),
            };
            assert_eq!(CachedReplay::decode(&replay.encode()), Some(replay));
        }
        assert_eq!(CachedReplay::decode(b""), None);
        assert_eq!(CachedReplay::decode(b"\x01short"), None);
        assert_eq!(CachedReplay::decode(b"\x07"), None);
    }
}
