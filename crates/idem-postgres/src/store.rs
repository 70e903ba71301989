//! [`PgStore`] and its `impl Store`: every transition one statement.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::{Object, Pool};
use idem::store::{ClaimOutcome, ClaimParams, Completion, Lease, TokenMint};
use idem::{Failure, RecordId, Store, StoreError, Timestamp};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Statement};

use crate::encode::{self, ms, token_bytes};
use crate::error::{pg_error, pool_error};
use crate::sql::Sql;
use crate::{conn, notify, schema};
use idem::group::{claim_through, complete_through, lost, Batch, Direct, GroupCommit, Pairs};

/// How many times a claim runs its statement when the statement's
/// snapshot keeps missing a row that a concurrent claim just committed.
const CLAIM_ROUNDS: usize = 8;

/// The PostgreSQL store. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
    /// Claims and completions made together go together (unless turned
    /// off); `None` in the copies the groups send through.
    pub(crate) groups: Option<Arc<Pairs<PgStore>>>,
    /// The outbox's confirmations made together go together, with the
    /// groups.
    pub(crate) confirms: Option<Arc<GroupCommit<Confirms>>>,
}

/// The outbox's confirmations, together as one call
/// (`sql/pending_confirm.sql`, `PgStore::confirm_now` in `pending.rs`).
pub(crate) struct Confirms(pub(crate) PgStore);

impl Batch for Confirms {
    type Call = (RecordId, u64);
    type Reply = Result<(), StoreError>;

    async fn one(&self, call: (RecordId, u64)) -> Self::Reply {
        self.0.confirm_now(&[call]).await
    }

    async fn many(&self, calls: Vec<(RecordId, u64)>) -> Vec<Self::Reply> {
        match self.0.confirm_now(&calls).await {
            Ok(()) => calls.iter().map(|_| Ok(())).collect(),
            Err(error) => calls.iter().map(|_| Err(error.copy())).collect(),
        }
    }

    fn lost(&self) -> Self::Reply {
        Err(lost())
    }
}

/// What clones of a store share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) schema: String,
    pub(crate) response_timeout: Duration,
    pub(crate) tokens: TokenMint,
    pub(crate) listener: notify::Listener,
    /// A failover seen by a connection of `pool`.
    pub(crate) demotion: Arc<conn::Demotion>,
    /// How long the schema remembers expired keys, in milliseconds (0:
    /// not at all); read from `idem_settings` at connect.
    pub(crate) memory_ms: AtomicU64,
}

impl PgStore {
    /// The schema holding the tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The claim statement as this store runs it (for `pgbench`); its
    /// parameters are listed at the top of `sql/claim.sql`.
    pub fn claim_sql(&self) -> &str {
        &self.inner.sql.claim
    }

    /// The batch claim statement as this store runs it (for `pgbench`);
    /// its parameters, one array element per claim, are listed at the top
    /// of `sql/claim_many.sql`.
    pub fn claim_many_sql(&self) -> &str {
        &self.inner.sql.claim_many
    }

    /// The complete statement as this store runs it (for `pgbench`).
    pub fn complete_sql(&self) -> &str {
        &self.inner.sql.complete
    }

    /// The batch complete statement as this store runs it (for `pgbench`);
    /// its parameters, one array element per completion, are listed at
    /// the top of `sql/complete_many.sql`.
    pub fn complete_many_sql(&self) -> &str {
        &self.inner.sql.complete_many
    }

    /// The statement that marks a journaled step started (for `pgbench`);
    /// its parameters are listed at the top of `sql/step_begin.sql`.
    pub fn step_begin_sql(&self) -> &str {
        &self.inner.sql.step_begin
    }

    /// The statement that journals a step's result (for `pgbench`).
    pub fn step_finish_sql(&self) -> &str {
        &self.inner.sql.step_finish
    }

    /// Applies the migrations not applied yet; returns their versions.
    pub async fn setup(&self) -> Result<Vec<i32>, StoreError> {
        let mut client = self.client().await?;
        let schema = self.schema();
        let applied = self.timed(schema::apply(&mut client, schema)).await?;
        if !applied.is_empty() {
            tracing::info!(%schema, ?applied, "applied idem migrations");
        }
        Ok(applied)
    }

    pub(crate) async fn client(&self) -> Result<Object, StoreError> {
        self.inner.pool.get().await.map_err(pool_error)
    }

    /// Runs `fut` under the response timeout, mapping its error.
    pub(crate) async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.response_timeout, fut).await {
            Ok(Err(error)) if error.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) => {
                self.inner.demotion.seen();
                Err(pg_error(error))
            }
            Ok(result) => result.map_err(pg_error),
            Err(_) => Err(StoreError::Unavailable(
                format!(
                    "PostgreSQL did not answer in {:?}",
                    self.inner.response_timeout
                )
                .into(),
            )),
        }
    }

    pub(crate) async fn prepare(
        &self,
        client: &Object,
        sql: &str,
    ) -> Result<Statement, StoreError> {
        self.timed(client.prepare_cached(sql)).await
    }

    /// Claims on `client` (a connection, or the transaction of a batch).
    pub(crate) async fn claim_on(
        &self,
        client: &impl GenericClient,
        statement: &Statement,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let fingerprint = params.fingerprint.map(|f| f.as_bytes().to_vec());
        let (lease, retention) = (ms(params.lease), ms(params.retention));
        for _ in 0..CLAIM_ROUNDS {
            let token = self.inner.tokens.next();
            let rows = self
                .timed(client.query(
                    statement,
                    &[
                        &id.scope().as_str(),
                        &id.key().as_str(),
                        &fingerprint,
                        &&token_bytes(token)[..],
                        &lease,
                        &retention,
                    ],
                ))
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

    /// How long the schema remembers expired keys ([`idem::horizon`]), if
    /// at all: what `idem_settings` said when this store connected.
    pub fn remembers_expired(&self) -> Option<Duration> {
        let ms = self.inner.memory_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Writes `set` (if given; zero turns it off) as the schema's memory of
    /// expired keys, then reads the schema's setting. A schema without the
    /// settings table (migrations applied by another tool, not yet 0011)
    /// does not remember, unless asked to, which is an error.
    pub(crate) async fn settle_memory(&self, set: Option<Duration>) -> Result<(), StoreError> {
        let table = format!("{}.idem_settings", self.schema());
        if let Some(memory) = set {
            let ms = i64::try_from(memory.as_millis()).unwrap_or(i64::MAX);
            let sql = format!(
                "INSERT INTO {table} (name, value) VALUES ('remember_ms', $1) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value"
            );
            self.write(&sql, &[&ms]).await?;
        }
        let sql = format!("SELECT value FROM {table} WHERE name = 'remember_ms'");
        let ms = match self.query(&sql, &[]).await {
            Ok(rows) => rows.first().map(|row| row.get::<_, i64>(0)).unwrap_or(0),
            Err(_) if set.is_none() => 0,
            Err(error) => return Err(error),
        };
        self.inner
            .memory_ms
            .store(u64::try_from(ms).unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    /// A claim on a schema that remembers expired keys
    /// (`sql/claim_remembering.sql`), one statement on a pooled connection.
    pub(crate) async fn claim_remembering(
        &self,
        id: &RecordId,
        params: &ClaimParams,
        memory: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let client = self.client().await?;
        let statement = self
            .prepare(&client, &self.inner.sql.claim_remembering)
            .await?;
        let fingerprint = params.fingerprint.map(|f| f.as_bytes().to_vec());
        let (lease, retention) = (ms(params.lease), ms(params.retention));
        let digest = idem::horizon::packed(&idem::horizon::digest(id));
        let prefix = idem::horizon::packed(&idem::horizon::fingerprint_prefix(
            params.fingerprint.as_ref(),
        ));
        let first_day = idem::horizon::first_kept_day(Timestamp::now(), memory);
        let day = i32::try_from(first_day).unwrap_or(i32::MAX);
        for _ in 0..CLAIM_ROUNDS {
            let token = self.inner.tokens.next();
            let rows = self
                .timed(client.query(
                    &statement,
                    &[
                        &id.scope().as_str(),
                        &id.key().as_str(),
                        &fingerprint,
                        &&token_bytes(token)[..],
                        &lease,
                        &retention,
                        &digest,
                        &prefix,
                        &day,
                    ],
                ))
                .await?;
            match encode::remembered_claim_outcome(&rows, id, token, params.fingerprint, first_day)?
            {
                Some(ClaimOutcome::Acquired(lease)) if lease.attempt == 1 && !lease.takeover => {
                    let recheck = self.prepare(&client, &self.inner.sql.claim_recheck).await?;
                    let found = self
                        .timed(client.query(
                            &recheck,
                            &[
                                &id.scope().as_str(),
                                &id.key().as_str(),
                                &&token_bytes(token)[..],
                                &digest,
                                &prefix,
                                &day,
                            ],
                        ))
                        .await?;
                    return Ok(match found.first() {
                        Some(row) => {
                            let remembered: i32 = row.get(0);
                            let ms = u64::try_from(remembered).unwrap_or(0) * idem::horizon::DAY_MS;
                            ClaimOutcome::Forgotten {
                                expired_at: Timestamp::from_millis(ms),
                            }
                        }
                        None => ClaimOutcome::Acquired(lease),
                    });
                }
                Some(outcome) => return Ok(outcome),
                None => {}
            }
        }
        Ok(ClaimOutcome::InProgress {
            retry_after: Duration::from_millis(10),
        })
    }

    /// Runs `sql` (prepared once per connection) on a pooled connection;
    /// its rows.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        let statement = self.prepare(&client, sql).await?;
        self.timed(client.query(&statement, params)).await
    }

    /// Runs a holder's write; the number of rows it changed.
    pub(crate) async fn write(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let statement = self.prepare(&client, sql).await?;
        self.timed(client.execute(&statement, params)).await
    }
}

pub(crate) fn lease_written(changed: u64) -> Result<(), StoreError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

/// One statement per call, on a connection of the pool.
impl Direct for PgStore {
    async fn claim_one(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let client = self.client().await?;
        let statement = self.prepare(&client, &self.inner.sql.claim).await?;
        self.claim_on(&**client, &statement, id, params).await
    }

    async fn complete_one(&self, completion: &Completion) -> Result<(), StoreError> {
        let lease = &completion.lease;
        let (scope, key) = (lease.id.scope().as_str(), lease.id.key().as_str());
        let token = token_bytes(lease.token);
        let (response, retention) = (&completion.response[..], ms(completion.retention));
        let changed = match completion.pending {
            None => {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&scope, &key, &&token[..], &response, &retention];
                self.write(&self.inner.sql.complete, &params).await?
            }
            Some(hold) => {
                let params: [&(dyn ToSql + Sync); 6] =
                    [&scope, &key, &&token[..], &response, &retention, &ms(hold)];
                self.write(&self.inner.sql.complete_pending, &params)
                    .await?
            }
        };
        lease_written(changed)
    }
}

impl Store for PgStore {
    idem::store_capabilities!(peek, steps, pending);

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
        let changed = self
            .write(
                &self.inner.sql.fail,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &failure.class.as_str(),
                    &failure.message.as_bytes(),
                    &ms(retention),
                ],
            )
            .await?;
        lease_written(changed)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        let rows = self
            .query(
                &self.inner.sql.extend,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                    &ms(duration),
                ],
            )
            .await?;
        let row = rows.first().ok_or(StoreError::LeaseLost)?;
        let until: std::time::SystemTime = row.try_get(0).map_err(|e| StoreError::Corrupt {
            id: lease.id.to_string(),
            reason: format!("lease_until: {e}"),
        })?;
        Ok(encode::timestamp(until))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let changed = self
            .write(
                &self.inner.sql.release,
                &[
                    &lease.id.scope().as_str(),
                    &lease.id.key().as_str(),
                    &&token_bytes(lease.token)[..],
                ],
            )
            .await?;
        lease_written(changed)
    }

    /// Waits for the record's end to be announced (see `notify.rs`) or
    /// `timeout`; returns at once if the record is not in progress. The
    /// caller claims again either way; the claim decides.
    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        self.wait_announced(id, timeout).await;
    }
}

impl PgStore {
    /// The store's `wait_for_change`: listens, marks the record waited
    /// (`sql/wait.sql`) and waits for its announcement, or polls where it
    /// cannot listen; returns at once if the record is not in progress.
    pub(crate) async fn wait_announced(&self, id: &RecordId, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + idem::store::held(timeout);
        let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
        let listener = &self.inner.listener;
        if !listener.listening(timeout).await {
            return idem::store::poll_while(left(), || self.in_progress(id)).await;
        }
        let payload = match self
            .query(
                &self.inner.sql.wait,
                &[&id.scope().as_str(), &id.key().as_str()],
            )
            .await
        {
            Ok(rows) => match rows.first().map(|row| row.try_get::<_, String>(0)) {
                Some(Ok(payload)) => payload,
                // Not in progress: nothing to wait for.
                None => return,
                Some(Err(error)) => {
                    tracing::debug!(%error, "unreadable wait payload; waiting by polling");
                    return idem::store::poll_while(left(), || self.in_progress(id)).await;
                }
            },
            Err(error) => {
                tracing::debug!(%error, "could not mark the record waited; waiting by polling");
                return idem::store::poll_while(left(), || self.in_progress(id)).await;
            }
        };
        let waiter = listener.waiters().enter(payload);
        waiter.wait(left(), || self.in_progress(id)).await;
    }

    /// Whether `id` is in progress; `false` when that cannot be read (the
    /// caller claims again and finds out).
    async fn in_progress(&self, id: &RecordId) -> bool {
        let state = self
            .query(
                &self.inner.sql.state,
                &[&id.scope().as_str(), &id.key().as_str()],
            )
            .await;
        matches!(&state, Ok(rows) if rows.first()
            .is_some_and(|row| row.try_get::<_, &str>(0).is_ok_and(|s| s == "in_progress")))
    }
}
