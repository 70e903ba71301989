//! [`AnyStore`]: every store, chosen at run time.

use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease, StepBegin};
use idem::{
    DeleteRecord, Failure, FindAbandoned, GetRecord, ListPage, ListQuery, ListRecords, MemoryStore,
    PurgeExpired, Record, RecordId, Resolution, Resolved, Scope, StepEntry, StepJournal, Store,
    StoreError, Timestamp,
};
use idem_mysql::MySqlStore;
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_remote::RemoteStore;
use idem_sqlite::SqliteStore;

/// Any store, chosen at run time (from a [`StoreUrl`](super::StoreUrl)).
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// In memory.
    Memory(MemoryStore),
    /// The embedded file.
    Sqlite(SqliteStore),
    /// Redis or a Redis Cluster.
    Redis(RedisStore),
    /// PostgreSQL.
    Postgres(PgStore),
    /// MySQL or MariaDB.
    MySql(MySqlStore),
    /// DynamoDB.
    #[cfg(feature = "dynamodb")]
    DynamoDb(idem_dynamodb::DynamoStore),
    /// A remote `idem serve`: records, claims and steps only; the
    /// operator's commands (list, delete, resolve) go to its own store.
    Remote(RemoteStore),
}

impl AnyStore {
    /// Starts purging expired records in the background (every 10 s, 1,000
    /// per transaction); stops when the handle is dropped.
    pub fn spawn_purger(&self) -> idem::PurgerHandle {
        idem::spawn_purger(self.clone(), Duration::from_secs(10), 1_000)
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Memory($s) => $e,
            AnyStore::Sqlite($s) => $e,
            AnyStore::Redis($s) => $e,
            AnyStore::Postgres($s) => $e,
            AnyStore::MySql($s) => $e,
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb($s) => $e,
            AnyStore::Remote($s) => $e,
        }
    };
}

/// [`each!`] for the operations every run makes (claim, complete, fail,
/// extend, release, read): the futures of the stores across a network are
/// boxed, one allocation beside a round trip, so that a run's future is
/// sized by the embedded stores' and not by the largest client's
/// (PostgreSQL's completion took 4 KiB, copied whole wherever a run's
/// future moved, on every store).
macro_rules! each_await {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Memory($s) => $e.await,
            AnyStore::Sqlite($s) => $e.await,
            AnyStore::Redis($s) => Box::pin($e).await,
            AnyStore::Postgres($s) => Box::pin($e).await,
            AnyStore::MySql($s) => Box::pin($e).await,
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb($s) => Box::pin($e).await,
            AnyStore::Remote($s) => Box::pin($e).await,
        }
    };
}

impl Store for AnyStore {
    async fn peek(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        GetRecord::get(self, id).await
    }

    fn step_journal(&self) -> Option<std::sync::Arc<dyn idem::store::DynStepJournal>> {
        each!(self, s => s.step_journal())
    }

    fn pending_sends(&self) -> Option<std::sync::Arc<dyn idem::store::DynPendingSends>> {
        each!(self, s => s.pending_sends())
    }

    fn local_now(&self) -> Option<idem::Timestamp> {
        each!(self, s => s.local_now())
    }

    fn keeps_bytes(&self) -> bool {
        each!(self, s => s.keeps_bytes())
    }

    fn sends_messages(&self) -> bool {
        each!(self, s => s.sends_messages())
    }

    fn max_stored_bytes(&self) -> Option<usize> {
        each!(self, s => s.max_stored_bytes())
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        each_await!(self, s => s.claim(id, params))
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        each_await!(self, s => s.complete(lease, response, retention))
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        each_await!(self, s => s.fail(lease, failure, retention))
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        each_await!(self, s => s.extend(lease, duration))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        each_await!(self, s => s.release(lease))
    }

    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        each_await!(self, s => s.wait_for_change(id, timeout))
    }
}

impl GetRecord for AnyStore {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        each_await!(self, s => s.get(id))
    }
}

/// What the claim API does not offer: an operator's command, meant for
/// the store behind `idem serve`.
fn not_remote(what: &str) -> StoreError {
    StoreError::Backend(
        format!("{what} is an operator's command: run it against the store behind idem serve")
            .into(),
    )
}

/// The stores with every operator's command (all but the remote one).
macro_rules! local {
    ($self:ident, $what:literal, $s:ident => $e:expr) => {
        match $self {
            AnyStore::Memory($s) => $e,
            AnyStore::Sqlite($s) => $e,
            AnyStore::Redis($s) => $e,
            AnyStore::Postgres($s) => $e,
            AnyStore::MySql($s) => $e,
            #[cfg(feature = "dynamodb")]
            AnyStore::DynamoDb($s) => $e,
            AnyStore::Remote(_) => Err(not_remote($what)),
        }
    };
}

impl DeleteRecord for AnyStore {
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        local!(self, "deleting a record", s => s.delete(id).await)
    }
}

impl ListRecords for AnyStore {
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        local!(self, "listing records", s => s.list(query).await)
    }
}

impl FindAbandoned for AnyStore {
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        local!(self, "finding abandoned records", s => s.abandoned(scope, limit).await)
    }
}

impl StepJournal for AnyStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        each_await!(self, s => s.begin_step(lease, step))
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        each_await!(self, s => s.finish_step(lease, step, result))
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        each!(self, s => s.steps(id).await)
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        each!(self, s => s.resolve_step(id, step, resolution).await)
    }
}

impl PurgeExpired for AnyStore {
    /// Purges up to `limit` expired records; a remote `idem serve` purges
    /// its own store, so through it this purges none.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        match self {
            AnyStore::Remote(_) => Ok(0),
            _ => local!(self, "purging", s => s.purge_expired(limit).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem::store::LeaseToken;
    use idem::Key;

    /// A run's future holds its store operations' futures and is moved
    /// whole: they stay the size of the embedded stores', whatever the
    /// largest client's (PostgreSQL's completion took 4.2 KiB, twice
    /// through the executor's timing, before the network stores' were
    /// boxed).
    #[test]
    fn a_runs_store_futures_are_sized_by_the_embedded_stores() {
        const MOST: usize = 1024;
        let store = AnyStore::Memory(MemoryStore::new());
        let id = RecordId::new(
            Scope::new("charges").expect("a scope"),
            Key::new("k").expect("a key"),
        );
        let params = ClaimParams {
            fingerprint: None,
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(60),
        };
        let lease = Lease {
            id: id.clone(),
            token: LeaseToken::from_u128(1),
            fence: 1,
            attempt: 1,
            takeover: false,
            lease_until: Timestamp::from_millis(0),
        };
        let sizes = [
            ("claim", std::mem::size_of_val(&store.claim(&id, &params))),
            (
                "complete",
                std::mem::size_of_val(&store.complete(&lease, Bytes::new(), params.retention)),
            ),
            (
                "extend",
                std::mem::size_of_val(&store.extend(&lease, params.lease)),
            ),
            ("release", std::mem::size_of_val(&store.release(&lease))),
            ("get", std::mem::size_of_val(&GetRecord::get(&store, &id))),
        ];
        for (op, size) in sizes {
            assert!(
                size <= MOST,
                "{op}'s future takes {size} bytes (at most {MOST})"
            );
        }
    }
}
