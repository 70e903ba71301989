//! [`MySqlStore`] and its `impl Store`: every transition one round trip.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::group::{claim_through, complete_through, Direct, Pairs};
use idem::store::{ClaimOutcome, ClaimParams, Completion, Lease, LeaseToken, TokenMint};
use idem::{Failure, RecordId, Store, StoreError, Timestamp};
use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Row, Value};

use crate::encode::{self, ms, token_bytes};
use crate::error::mysql_error;
use crate::schema;
use crate::sql::{self, Sql};

/// How many times a claim runs when it finds a state that should have
/// been claimable (it never should: the procedure decides on a locked row).
pub(crate) const CLAIM_ROUNDS: usize = 4;

/// The MySQL and MariaDB store. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pub(crate) inner: Arc<Inner>,
    /// Claims and completions made together go together (unless turned
    /// off); `None` in the copies the groups send through.
    pub(crate) groups: Option<Arc<Pairs<MySqlStore>>>,
}

/// What clones of a store share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) database: String,
    pub(crate) response_timeout: Duration,
    pub(crate) tokens: TokenMint,
    /// The largest response a statement can carry ([`stored_limit`]).
    pub(crate) max_stored_bytes: usize,
    /// How long expired keys are remembered, in ms (0: not at all), as
    /// `idem_settings` said at connect ([`crate::horizon`]).
    pub(crate) memory_ms: AtomicU64,
}

/// The server's `max_allowed_packet` when it does not say (MariaDB's and
/// MySQL 8's default).
pub(crate) const DEFAULT_MAX_PACKET: u64 = 16 << 20;

/// The largest response that fits a packet of `max_packet` bytes: room for
/// the statement and the record's other fields, and a batch sends
/// responses in base64 (4 bytes for 3). A larger one would make the
/// server drop the connection: an unknown outcome, not a refusal.
pub(crate) fn stored_limit(max_packet: u64) -> usize {
    let packet = usize::try_from(max_packet).unwrap_or(usize::MAX);
    packet.saturating_sub(64 * 1024) / 4 * 3
}

/// A record's id as the statements take it.
pub(crate) fn id_params(id: &RecordId) -> [Value; 2] {
    [
        Value::Bytes(id.scope().as_str().as_bytes().to_vec()),
        Value::Bytes(id.key().as_str().as_bytes().to_vec()),
    ]
}

/// A claim's arguments as `idem_claim` and `idem_claim_row` take them
/// (after `idem_claim_row`'s answer slot): scope, key, fingerprint or
/// NULL, token, lease ms, retention ms.
pub(crate) fn claim_args(id: &RecordId, params: &ClaimParams, token: LeaseToken) -> Vec<Value> {
    let [scope, key] = id_params(id);
    vec![
        scope,
        key,
        params
            .fingerprint
            .map_or(Value::NULL, |f| Value::Bytes(f.as_bytes().to_vec())),
        Value::Bytes(token_bytes(token)),
        Value::Int(ms(params.lease)),
        Value::Int(ms(params.retention)),
    ]
}

/// A lease's record and token as the statements take them.
pub(crate) fn lease_params(lease: &Lease) -> [Value; 3] {
    let [scope, key] = id_params(&lease.id);
    [scope, key, Value::Bytes(token_bytes(lease.token))]
}

impl MySqlStore {
    /// The database holding the tables.
    pub fn database(&self) -> &str {
        &self.inner.database
    }

    /// The store's connection pool (each connection `READ COMMITTED`), for
    /// the [inbox](crate::inbox) and the [outbox](crate::outbox) on the
    /// same database.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The claim call as this store sends it (for a benchmark's own
    /// driver): `scope, key, fingerprint or NULL, 16-byte token, lease ms,
    /// retention ms`; it answers one row (`migrations/0004_procedures.sql`).
    pub fn claim_sql(&self) -> &'static str {
        sql::CLAIM
    }

    /// The complete statement as this store sends it: `response,
    /// retention ms, scope, key, token`; one row changed when the lease
    /// held.
    pub fn complete_sql(&self) -> &str {
        &self.inner.sql.complete
    }

    /// Applies the migrations not applied yet; returns their versions.
    pub async fn setup(&self) -> Result<Vec<u32>, StoreError> {
        let applied = self
            .timed(async {
                let mut conn = self.inner.pool.get_conn().await?;
                schema::apply(&mut conn).await
            })
            .await?;
        if !applied.is_empty() {
            tracing::info!(database = %self.database(), ?applied, "applied idem migrations");
        }
        Ok(applied)
    }

    /// Runs `fut` under the response timeout, mapping its error.
    pub(crate) async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, mysql_async::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.response_timeout, fut).await {
            Ok(result) => result.map_err(mysql_error),
            Err(_) => Err(StoreError::Unavailable(
                format!("MySQL did not answer in {:?}", self.inner.response_timeout).into(),
            )),
        }
    }

    /// Runs `sql` (prepared once per connection); the rows of its result
    /// set. A procedure sends its one result set last, after it commits
    /// (`migrations/0004_procedures.sql`): the driver would report an error
    /// raised after a result set only with the connection's next statement.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<Vec<Row>, StoreError> {
        self.timed(async {
            let mut conn = self.inner.pool.get_conn().await?;
            let mut result = conn.exec_iter(sql, params).await?;
            let rows: Vec<Row> = result.collect().await?;
            result.drop_result().await?;
            Ok(rows)
        })
        .await
    }

    /// Runs a write; the number of rows it changed.
    pub(crate) async fn write(&self, sql: &str, params: Vec<Value>) -> Result<u64, StoreError> {
        self.timed(async {
            let mut conn = self.inner.pool.get_conn().await?;
            conn.exec_drop(sql, params).await?;
            Ok(conn.affected_rows())
        })
        .await
    }

    /// One claim (`idem_claim`).
    pub(crate) async fn claim_single(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..CLAIM_ROUNDS {
            let token = self.inner.tokens.next();
            let rows = self
                .query(sql::CLAIM, claim_args(id, params, token))
                .await?;
            if let Some(outcome) =
                encode::claim_outcome(rows.first(), id, token, params.fingerprint)?
            {
                return Ok(outcome);
            }
        }
        Ok(ClaimOutcome::InProgress {
            retry_after: Duration::from_millis(10),
        })
    }

    /// Whether `id` is in progress; `false` when that cannot be read (the
    /// caller claims again and finds out).
    async fn in_progress(&self, id: &RecordId) -> bool {
        let rows = self
            .query(&self.inner.sql.state, id_params(id).to_vec())
            .await;
        matches!(&rows, Ok(rows) if rows.first().and_then(|r| encode::int_at(r, 0)) == Some(1))
    }
}

pub(crate) fn lease_written(changed: u64) -> Result<(), StoreError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

/// One round trip per call, on a connection of the pool.
impl Direct for MySqlStore {
    async fn claim_one(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_single(id, params).await
    }

    /// A plain completion: this store keeps no pending index, so no
    /// completion it is handed marks one.
    async fn complete_one(&self, completion: &Completion) -> Result<(), StoreError> {
        let response = completion.response.to_vec();
        let mut params = vec![Value::Bytes(response), Value::Int(ms(completion.retention))];
        params.extend(lease_params(&completion.lease));
        let changed = self.write(&self.inner.sql.complete, params).await?;
        lease_written(changed)
    }
}

impl Store for MySqlStore {
    idem::store_capabilities!(peek, steps);

    fn max_stored_bytes(&self) -> Option<usize> {
        Some(self.inner.max_stored_bytes)
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        match self.remembers_expired() {
            Some(memory) if idem::horizon::remembered_scope(id.scope().as_str()) => {
                self.claim_remembering(id, params, memory).await
            }
            _ => claim_through(self.groups.as_deref(), self, id, params).await,
        }
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let completion = Completion::new(lease.clone(), response, retention);
        complete_through(self.groups.as_deref(), self, completion).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let class = failure.class.as_str();
        let mut params = vec![
            Value::Bytes(class.as_bytes().to_vec()),
            Value::Bytes(class.as_bytes().to_vec()),
            Value::Bytes(failure.message.as_bytes().to_vec()),
            Value::Int(ms(retention)),
        ];
        params.extend(lease_params(lease));
        let changed = self.write(&self.inner.sql.fail, params).await?;
        lease_written(changed)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        let mut params = lease_params(lease).to_vec();
        params.push(Value::Int(ms(duration)));
        let rows = self.query(sql::EXTEND, params).await?;
        let until = rows
            .first()
            .and_then(|r| encode::int_at(r, 0))
            .ok_or(StoreError::LeaseLost)?;
        u64::try_from(until)
            .map(Timestamp::from_millis)
            .map_err(|_| StoreError::Corrupt {
                id: lease.id.to_string(),
                reason: format!("lease_until {until}"),
            })
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let changed = self
            .write(&self.inner.sql.release, lease_params(lease).to_vec())
            .await?;
        lease_written(changed)
    }

    /// MySQL has no notifications: waits by polling the record's state
    /// (5 ms doubling to 200 ms) until it is no longer in progress or
    /// `timeout` ends. The caller claims again either way; the claim
    /// decides.
    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        idem::store::poll_while(idem::store::held(timeout), || self.in_progress(id)).await;
    }
}
