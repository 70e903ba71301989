//! What an operator and the purger call on a store: read, delete, list,
//! purge, find abandoned records, and the record's time to live.

use std::future::Future;
use std::time::Duration;

use super::{Store, StoreError};
use crate::key::{RecordId, Scope};
use crate::record::{Record, StateKind};

/// Reads a record (expired records read as absent).
pub trait GetRecord: Store {
    /// The record for `id`, or `None` if absent or expired.
    fn get(&self, id: &RecordId)
        -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
}

/// Deletes a record whatever its state: the admin's force-release. Any
/// lease on it is lost; fencing numbers stay monotonic.
pub trait DeleteRecord: Store {
    /// Deletes `id`; `true` if a live record was there.
    fn delete(&self, id: &RecordId) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// A page request for [`ListRecords`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only records in this state, if set.
    pub state: Option<StateKind>,
    /// Only records in this scope, if set.
    pub scope: Option<Scope>,
    /// Start after this id (the previous page's `next`).
    pub after: Option<RecordId>,
    /// At most this many records.
    pub limit: usize,
}

impl ListQuery {
    /// The first page of up to `limit` records of any state and scope.
    pub fn new(limit: usize) -> Self {
        Self {
            state: None,
            scope: None,
            after: None,
            limit,
        }
    }

    /// Only records in `state`.
    pub fn state(mut self, state: StateKind) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records in `scope`.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Start after `id`.
    pub fn after(mut self, id: RecordId) -> Self {
        self.after = Some(id);
        self
    }
}

/// One page of live records, ordered by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The records on this page.
    pub records: Vec<(RecordId, Record)>,
    /// Where the next page starts, if there may be one.
    pub next: Option<RecordId>,
}

impl ListPage {
    /// A page of `records` a store read in id order, at most `limit` of
    /// them: `next` is set when the page is full (there may be more).
    pub fn ordered(records: Vec<(RecordId, Record)>, limit: usize) -> Self {
        let next = (records.len() == limit && limit > 0)
            .then(|| records.last().map(|(id, _)| id.clone()))
            .flatten();
        Self { records, next }
    }

    /// The first `limit` of `found` in id order, for stores that find a
    /// page's records in no particular order (a scan): `next` is set when
    /// more were found than fit.
    pub fn first_of(mut found: Vec<(RecordId, Record)>, limit: usize) -> Self {
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let more = found.len() > limit;
        found.truncate(limit);
        let next = if more {
            found.last().map(|(id, _)| id.clone())
        } else {
            None
        };
        Self {
            records: found,
            next,
        }
    }
}

/// Lists live records by state and scope, in id order, a page at a time.
pub trait ListRecords: Store {
    /// One page of records matching `query`.
    fn list(&self, query: &ListQuery) -> impl Future<Output = Result<ListPage, StoreError>> + Send;
}

/// Removes expired records in bounded batches.
pub trait PurgeExpired: Store {
    /// Removes at most `limit` expired records; returns how many. Call
    /// again while it returns `limit`.
    fn purge_expired(&self, limit: usize)
        -> impl Future<Output = Result<usize, StoreError>> + Send;
}

/// Finds abandoned records: in progress, live, with a lease that has run
/// out (their holder crashed, was killed or stalled), as the store's own
/// clock sees it. The [`Completer`](crate::durable::Completer) re-drives
/// them.
pub trait FindAbandoned: Store {
    /// Up to `limit` abandoned records of `scope` (see
    /// [`Record::is_abandoned`](crate::Record::is_abandoned)). Stores with
    /// an index return the longest-abandoned first; every store returns
    /// each abandoned record on some call as long as it stays abandoned.
    fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(RecordId, Record)>, StoreError>> + Send;
}

/// How long a completed record stays live, measured by the store's own
/// clock: what a cache in front of the store
/// ([`Cached`](crate::cache::Cached)) needs so that it never serves a
/// record past its expiry.
pub trait RecordTtl: Store {
    /// The time left before `id` expires, if it is completed with exactly
    /// `response`; `None` if it is absent, expired, or holds anything else.
    /// Read in one step with the record, so that a record deleted and
    /// claimed again since `response` was read (a new run, in progress) is
    /// never cached under the new record's life.
    fn ttl(
        &self,
        id: &RecordId,
        response: &[u8],
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send;
}
