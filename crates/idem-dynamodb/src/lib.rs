//! The DynamoDB store for idem.
//!
//! Every transition is one conditional write (`PutItem` or `UpdateItem`
//! with a condition expression), and a write whose condition fails gets
//! the item back in the same answer (`ReturnValuesOnConditionCheckFailure
//! = ALL_OLD`), so no extra read is needed to learn what is there. The
//! rules themselves are [`idem::machine`]'s, shared with every other store.
//!
//! * **Claims.** A claim first tries to create the item, on the condition
//!   that it is absent *or expired* (`attribute_not_exists(pk) OR ex <=
//!   :now`): an expired record is claimable whether or not DynamoDB's TTL
//!   sweeper (which may lag by up to 48 hours) has deleted it. If the
//!   condition fails, the returned item is decided on by
//!   [`idem::machine::decide_claim`]: a replay, a conflict or a mismatch is
//!   answered at once from it; a takeover or a release is written on the
//!   condition that the item's version (`v`, raised by every write) is
//!   still the one decided on.
//! * **Holder writes** (complete, fail, release, heartbeat, step journal)
//!   are one `UpdateItem` on the condition that the record is live, in
//!   progress and carries the lease's token. A write whose condition fails
//!   is `LeaseLost`, unless the returned item shows that the write had
//!   already happened: the SDK retries a request whose answer was lost, and
//!   the retry must not report a lost lease for a write that landed.
//! * **Time.** DynamoDB has no clock that a condition can read, so `:now`
//!   comes from the store's [`Clock`] ([`SystemClock`] by default, so
//!   clients' clocks must agree to well within a lease; NTP does that).
//!   Tests inject a [`ManualClock`](idem::ManualClock). What clocks that
//!   disagree by more than that do: a client ahead sees a live lease as
//!   run out and takes the record over while its holder still works, and a
//!   client behind writes leases that the others see as run out already;
//!   either way a handler can run twice at once. Neither lets two
//!   completions be accepted or a stale holder write: every holder write
//!   is conditioned on the token, and fences rise with the stored one. Use
//!   the fence for downstream writes (`RELIABILITY.md`, `dynamodb-lease`:
//!   skews of up to half a lease between workers and jumps of up to three
//!   leases, 0 violations).
//! * **Fences** rise per key: past the stored one, and past the clock in
//!   microseconds for a key with no item. An expired item, and a deleted
//!   one (a tombstone), keeps its fence until DynamoDB removes it, `grace`
//!   after its retention, or [`PurgeExpired`] does, once its fence is older
//!   than `grace` by the purging clock. So clocks that disagree by less
//!   than `grace` (an hour by default) cannot make a fence fall; clocks
//!   further apart can, for a key claimed again after its item is gone.
//! * **Size.** Responses longer than 1 KiB are stored zstd-compressed when
//!   that is shorter; a response that would still pass DynamoDB's 400 KB
//!   limit is refused with [`ItemTooLarge`] before anything is sent. The
//!   step journal shares the record's item and is not read before a
//!   write, so a response that fits alone but not beside large step
//!   results is refused by DynamoDB itself (a `ValidationException`).
//!   Either way the executor records the run as failed with the reason,
//!   and it is replayed as such: the handler does not run again.
//!
//! The table needs only a string partition key `pk`; [`create_table`]
//! makes one (on-demand capacity, TTL on the `sweep_at` attribute). The item
//! layout is in the [`item`] module's documentation.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_dynamodb::{client_from_env, create_table, DynamoStore};
//!
//! // With aws-config in the application: `Client::new(&aws_config::load_from_env().await)`.
//! let client = client_from_env(Some("http://127.0.0.1:5000"))?;
//! create_table(&client, "idem_records").await?;
//! let store = DynamoStore::new(client, "idem_records");
//! # let _ = store; Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use aws_sdk_dynamodb::Client;
use bytes::Bytes;
use idem::machine::{self, ClaimDecision, Fresh, Write};
use idem::{
    ClaimOutcome, ClaimParams, Clock, DeleteRecord, Failure, FailureClass, FindAbandoned,
    GetRecord, Lease, ListPage, ListQuery, ListRecords, PurgeExpired, Record, RecordId, RecordTtl,
    Resolution, Resolved, Scope, State, StepBegin, StepEntry, StepJournal, Store, StoreError,
    SystemClock, Timestamp, TokenMint,
};

pub mod item;
mod many;
mod setup;

use item::{n, s, Encoding, Item, Step, Stored};
pub use setup::{
    client_for, client_from_env, create_table, ConfigError, ATTEMPT_TIMEOUT, OPERATION_TIMEOUT,
};

/// How long an item stays in DynamoDB past its retention by default, so a
/// key claimed again soon after expiry still finds the fence to build on.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// Responses longer than this are stored compressed (when that is shorter).
pub const DEFAULT_COMPRESS_ABOVE: usize = 1024;

/// What a record's item holds besides its response, at most (names,
/// numbers, token, fingerprint, failure): the room a response must leave.
const RECORD_OVERHEAD: usize = 1024;

/// How many writes of a batch (`claim_many`, `complete_many`) are in
/// flight at once.
const BATCH_CONCURRENCY: usize = 32;

/// How many times a claim re-decides after losing a race on the item
/// before it gives up. Every lost race means another writer won, so a
/// handful is plenty; the bound only stops a livelock.
const MAX_RACES: usize = 64;

/// An item would pass DynamoDB's 400 KB limit even compressed. Nothing
/// was written. Returned inside [`StoreError::Backend`].
#[derive(Debug, thiserror::Error)]
#[error(
    "record {id} would be {size} bytes as a DynamoDB item (response compressed where that helps), \
     over DynamoDB's limit of {limit} bytes per item"
)]
pub struct ItemTooLarge {
    /// The record, as `scope/key`.
    pub id: String,
    /// The item's size, attribute names included.
    pub size: usize,
    /// DynamoDB's limit.
    pub limit: usize,
}

/// The DynamoDB store. Cheap to clone; clones share the client.
#[derive(Clone)]
pub struct DynamoStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    table: String,
    settings: Settings,
    mint: TokenMint,
    /// Where the last purge left off (a partition key), so purges walk the
    /// whole table in turn instead of rescanning its start.
    purge_from: parking_lot::Mutex<Option<String>>,
}

/// What the `with_*` methods set.
#[derive(Clone)]
struct Settings {
    clock: Arc<dyn Clock>,
    grace: Duration,
    encoding: Encoding,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.inner.table)
            .field("grace", &self.inner.settings.grace)
            .finish_non_exhaustive()
    }
}

/// What a conditional write came to.
enum Written {
    /// The condition held; the attributes asked for with `ReturnValues`.
    Done(Option<Item>),
    /// The condition failed; the item as it was (`None`: there was none).
    Refused(Option<Item>),
}

impl DynamoStore {
    /// A store on `table` through `client`, with the defaults: the system
    /// clock, [`DEFAULT_GRACE`], [`DEFAULT_COMPRESS_ABOVE`].
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let settings = Settings {
            clock: Arc::new(SystemClock),
            grace: DEFAULT_GRACE,
            encoding: Encoding {
                compress_above: DEFAULT_COMPRESS_ABOVE,
            },
        };
        Self::build(client, table.into(), settings)
    }

    fn build(client: Client, table: String, settings: Settings) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                table,
                settings,
                mint: TokenMint::new(),
                purge_from: parking_lot::Mutex::new(None),
            }),
        }
    }

    /// The same store with `change` made to its settings.
    fn with(self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.inner.settings.clone();
        change(&mut settings);
        Self::build(
            self.inner.client.clone(),
            self.inner.table.clone(),
            settings,
        )
    }

    /// Decides time with `clock` instead of the system clock (tests use a
    /// [`ManualClock`](idem::ManualClock)). Every client of one table must
    /// use clocks that agree.
    pub fn with_clock(self, clock: impl Clock) -> Self {
        self.with(|s| s.clock = Arc::new(clock))
    }

    /// Keeps items `grace` past their retention before DynamoDB's TTL may
    /// delete them (their fence survives that long).
    pub fn with_grace(self, grace: Duration) -> Self {
        self.with(|s| s.grace = grace)
    }

    /// Compresses responses longer than `bytes` (when that is shorter).
    pub fn with_compress_above(self, bytes: usize) -> Self {
        self.with(|s| s.encoding.compress_above = bytes)
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    fn now(&self) -> Timestamp {
        self.inner.settings.clock.now()
    }

    fn grace_secs(&self) -> u64 {
        self.inner.settings.grace.as_secs()
    }

    fn key(id: &RecordId) -> HashMap<String, AttributeValue> {
        HashMap::from([("pk".to_owned(), s(item::pk(id)))])
    }

    fn encode(
        &self,
        id: &RecordId,
        record: &Record,
        version: u64,
        nonce: Option<idem::LeaseToken>,
    ) -> Item {
        item::encode(
            id,
            record,
            version,
            nonce,
            self.grace_secs(),
            self.inner.settings.encoding,
        )
    }

    /// Refuses an item of `size` bytes over DynamoDB's limit.
    fn check_size(id: &RecordId, size: usize) -> Result<(), StoreError> {
        if size > item::ITEM_LIMIT {
            return Err(StoreError::Backend(Box::new(ItemTooLarge {
                id: id.to_string(),
                size,
                limit: item::ITEM_LIMIT,
            })));
        }
        Ok(())
    }

    /// `PutItem` of `item` on `condition`.
    async fn put(
        &self,
        item: Item,
        condition: &str,
        values: HashMap<String, AttributeValue>,
    ) -> Result<Written, StoreError> {
        let mut request = self
            .inner
            .client
            .put_item()
            .table_name(&self.inner.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if !values.is_empty() {
            request = request.set_expression_attribute_values(Some(values));
        }
        match request.send().await {
            Ok(_) => Ok(Written::Done(None)),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                let old = match e.into_err() {
                    aws_sdk_dynamodb::operation::put_item::PutItemError::ConditionalCheckFailedException(c) => c.item,
                    _ => None,
                };
                Ok(Written::Refused(old))
            }
            Err(e) => Err(map_err(e)),
        }
    }

    /// `UpdateItem` of `id` with `update` on `condition`.
    async fn update(&self, id: &RecordId, op: Update<'_>) -> Result<Written, StoreError> {
        let mut request = self
            .inner
            .client
            .update_item()
            .table_name(&self.inner.table)
            .set_key(Some(Self::key(id)))
            .update_expression(op.update)
            .condition_expression(op.condition)
            .set_expression_attribute_values(Some(op.values))
            .return_values(op.returns)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if !op.names.is_empty() {
            request = request.set_expression_attribute_names(Some(op.names));
        }
        match request.send().await {
            Ok(out) => Ok(Written::Done(out.attributes)),
            Err(SdkError::ServiceError(e)) if e.err().is_conditional_check_failed_exception() => {
                let old = match e.into_err() {
                    aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(c) => c.item,
                    _ => None,
                };
                Ok(Written::Refused(old))
            }
            Err(e) => Err(map_err(e)),
        }
    }

    /// The item of `id`, read consistently.
    async fn read(&self, id: &RecordId) -> Result<Option<Stored>, StoreError> {
        let out = self
            .inner
            .client
            .get_item()
            .table_name(&self.inner.table)
            .set_key(Some(Self::key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(map_err)?;
        out.item.map(|i| item::decode(&i, Some(id))).transpose()
    }

    /// The live record of `id`, or `None`.
    async fn live(&self, id: &RecordId) -> Result<Option<Stored>, StoreError> {
        let now = self.now();
        Ok(self.read(id).await?.filter(|s| !s.record.is_expired(now)))
    }

    /// Writes `record` over the item `seen` (keeping its journal, or with
    /// `journal`), on the condition that the item is still at `seen`'s
    /// version (or still absent).
    async fn replace(
        &self,
        id: &RecordId,
        seen: Option<&Stored>,
        record: &Record,
        nonce: Option<idem::LeaseToken>,
        journal: HashMap<String, AttributeValue>,
    ) -> Result<Written, StoreError> {
        let version = seen.map_or(1, |s| s.version + 1);
        let mut item = self.encode(id, record, version, nonce);
        item.insert("j".into(), AttributeValue::M(journal));
        Self::check_size(id, item::size(&item))?;
        match seen {
            None => {
                self.put(item, "attribute_not_exists(pk)", HashMap::new())
                    .await
            }
            Some(seen) => {
                let values = HashMap::from([(":v".to_owned(), n(seen.version))]);
                self.put(item, "v = :v", values).await
            }
        }
    }

    /// The first try of a claim: creates the item if it is absent or
    /// expired (and its fence below ours).
    async fn claim_fresh(
        &self,
        id: &RecordId,
        record: &Record,
        now: Timestamp,
    ) -> Result<Written, StoreError> {
        let mut item = self.encode(id, record, 1, None);
        item.insert("j".into(), AttributeValue::M(HashMap::new()));
        Self::check_size(id, item::size(&item))?;
        let values = HashMap::from([
            (":now".to_owned(), n(now.as_millis())),
            (":fe".to_owned(), n(record.fence)),
        ]);
        self.put(
            item,
            "attribute_not_exists(pk) OR (ex <= :now AND fe < :fe)",
            values,
        )
        .await
    }

    /// A holder's write: `update` (which must set `wn = :wn`) on the
    /// condition that `lease` still holds the record. A refusal is
    /// `LeaseLost`, unless the returned item carries this write's nonce:
    /// then the write had landed and this was the SDK retrying it after its
    /// answer was lost. A caller repeating a write sends a new nonce, so it
    /// is refused as it must be.
    async fn held_write(
        &self,
        lease: &Lease,
        update: &str,
        mut values: HashMap<String, AttributeValue>,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let nonce = self.inner.mint.next();
        values.insert(":wn".into(), s(nonce.to_hex()));
        values.extend(held_values(lease, now));
        let op = Update {
            update,
            condition: HELD,
            values,
            names: HashMap::new(),
            returns: ReturnValue::None,
        };
        match self.update(&lease.id, op).await? {
            Written::Done(_) => Ok(()),
            Written::Refused(old) => {
                let old = old.map(|i| item::decode(&i, Some(&lease.id))).transpose()?;
                match old {
                    Some(old) if old.nonce == Some(nonce) => Ok(()),
                    _ => Err(StoreError::LeaseLost),
                }
            }
        }
    }

    fn fresh(&self, now: Timestamp) -> Fresh {
        Fresh {
            token: self.inner.mint.next(),
            fence_floor: now.as_millis().saturating_mul(1000),
        }
    }

    /// Scans the whole table for live records matching `filter` (an
    /// expression over `:now` and `values`), consistently, a page at a
    /// time.
    async fn scan_live(
        &self,
        filter: &str,
        mut values: HashMap<String, AttributeValue>,
        now: Timestamp,
    ) -> Result<Vec<Stored>, StoreError> {
        values.insert(":now".into(), n(now.as_millis()));
        let mut pages = self
            .inner
            .client
            .scan()
            .table_name(&self.inner.table)
            .consistent_read(true)
            .filter_expression(format!("ex > :now AND ({filter})"))
            .set_expression_attribute_values(Some(values))
            .into_paginator()
            .items()
            .send();
        let mut found = Vec::new();
        while let Some(next) = pages.next().await {
            found.push(item::decode(&next.map_err(map_err)?, None)?);
        }
        Ok(found)
    }
}

/// The condition of every holder's write: live, in progress, this token.
const HELD: &str = "st = :p AND tk = :tk AND ex > :now";

/// The values [`HELD`] reads, and `:one` for raising the version.
fn held_values(lease: &Lease, now: Timestamp) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (":p".to_owned(), s("p")),
        (":tk".to_owned(), s(lease.token.to_hex())),
        (":now".to_owned(), n(now.as_millis())),
        (":one".to_owned(), n(1)),
    ])
}

/// One `UpdateItem`.
struct Update<'a> {
    update: &'a str,
    condition: &'a str,
    values: HashMap<String, AttributeValue>,
    names: HashMap<String, String>,
    returns: ReturnValue,
}

/// DynamoDB error codes after which the request was not applied and a
/// later try can succeed: throttling, the service failing, and a
/// conflict with a transaction on the same item (DESIGN §5.5).
const TRANSIENT_CODES: &[&str] = &[
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "ReplicatedWriteConflictException",
];

/// Whether a DynamoDB error code is transient ([`TRANSIENT_CODES`]).
fn transient_code(code: &str) -> bool {
    TRANSIENT_CODES.contains(&code)
}

/// Maps an SDK error: the service or the network failing (or throttling
/// past the SDK's own retries) is `Unavailable`, so the executor fails
/// closed; anything else (a missing table, a request DynamoDB refused) is
/// `Backend`, with DynamoDB's own message.
pub(crate) fn map_err<E>(e: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let context = |e: &SdkError<E, HttpResponse>| -> idem::BoxError {
        format!("{}", aws_sdk_dynamodb::error::DisplayErrorContext(e)).into()
    };
    match &e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Unavailable(context(&e))
        }
        SdkError::ServiceError(ctx) => {
            let code = ctx.err().code().unwrap_or("");
            let message = format!(
                "DynamoDB refused the request: {}: {}",
                if code.is_empty() {
                    "unknown error"
                } else {
                    code
                },
                ctx.err().message().unwrap_or("no message")
            );
            if matches!(
                code,
                "TransactionConflictException" | "ReplicatedWriteConflictException"
            ) {
                // Another write on the item: the key is busy, not the store
                // down, so never a reason to fail open.
                StoreError::contended(message)
            } else if transient_code(code) || ctx.raw().status().is_server_error() {
                StoreError::Unavailable(message.into())
            } else {
                StoreError::Backend(message.into())
            }
        }
        _ => StoreError::Backend(context(&e)),
    }
}

impl Store for DynamoStore {
    async fn peek(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        GetRecord::get(self, id).await
    }

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        let now = self.now();
        let fresh = self.fresh(now);
        let (record, outcome) = machine::decide_claim(None, params, now, fresh).into_parts(id);
        let record = record.expect("a claim on nothing acquires");
        let mut conflict = match self.claim_fresh(id, &record, now).await? {
            Written::Done(_) => return Ok(outcome),
            Written::Refused(old) => old,
        };
        // Whether the last write tried (the only one that may have landed
        // unseen) was a takeover.
        let mut last_takeover = false;
        for _ in 0..MAX_RACES {
            let seen = conflict.map(|i| item::decode(&i, Some(id))).transpose()?;
            if let Some(seen) = &seen {
                if matches!(seen.record.state, State::InProgress { token, .. } if token == fresh.token)
                {
                    // Our own write, which the SDK retried after its answer was lost.
                    return Ok(acquired(id, &seen.record, last_takeover));
                }
            }
            let now = self.now();
            let decision =
                machine::decide_claim(seen.as_ref().map(|s| &s.record), params, now, fresh);
            last_takeover = matches!(decision, ClaimDecision::Acquire { takeover: true, .. });
            let (record, outcome) = decision.into_parts(id);
            let Some(record) = record else {
                return Ok(outcome);
            };
            let journal = match &seen {
                Some(seen) if !seen.record.is_expired(now) => seen.journal.clone(),
                _ => HashMap::new(),
            };
            conflict = match self
                .replace(id, seen.as_ref(), &record, None, journal)
                .await?
            {
                Written::Done(_) => return Ok(outcome),
                Written::Refused(old) => old,
            };
        }
        Err(StoreError::Backend(
            format!("claim of {id:?} lost {MAX_RACES} races in a row on its item").into(),
        ))
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let (attr, value) = self.inner.settings.encoding.response(&response);
        let size = value.as_b().map_or(0, |b| b.as_ref().len()) + RECORD_OVERHEAD;
        Self::check_size(&lease.id, size)?;
        let ex = now.saturating_add(retention);
        // The response is set first. The step journal shares the item, so
        // DynamoDB can still refuse the write as too large; its UpdateItem
        // is atomic, but moto (the tests' DynamoDB) applies an update's
        // actions one by one and keeps those before the one that
        // overflowed, which would leave "completed" without a response.
        let update = format!(
            "SET {attr} = :r, st = :c, ex = :ex, sweep_at = :ttl, ua = :now, wn = :wn, v = v + :one \
             REMOVE tk, lu, fc, fm"
        );
        let values = HashMap::from([
            (":c".to_owned(), s("c")),
            (":r".to_owned(), value),
            (":ex".to_owned(), n(ex.as_millis())),
            (":ttl".to_owned(), n(item::ttl(ex, self.grace_secs()))),
        ]);
        self.held_write(lease, &update, values).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let ex = now.saturating_add(retention);
        let state = if failure.class == FailureClass::Retryable {
            "r"
        } else {
            "f"
        };
        let values = HashMap::from([
            (":st".to_owned(), s(state)),
            (":fc".to_owned(), s(failure.class.as_str())),
            (":fm".to_owned(), s(failure.message.clone())),
            (":ex".to_owned(), n(ex.as_millis())),
            (":ttl".to_owned(), n(item::ttl(ex, self.grace_secs()))),
        ]);
        self.held_write(
            lease,
            "SET st = :st, fc = :fc, fm = :fm, ex = :ex, sweep_at = :ttl, ua = :now, wn = :wn, \
             v = v + :one REMOVE tk, lu",
            values,
        )
        .await
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        let now = self.now();
        let until = now.saturating_add(duration);
        // The usual heartbeat: the lease moves forward within the retention.
        let mut values = held_values(lease, now);
        values.insert(":lu".to_owned(), n(until.as_millis()));
        let op = Update {
            update: "SET lu = :lu, ua = :now, v = v + :one",
            condition: &format!("{HELD} AND lu <= :lu AND ex >= :lu"),
            values,
            names: HashMap::new(),
            returns: ReturnValue::None,
        };
        let mut conflict = match self.update(&lease.id, op).await? {
            Written::Done(_) => return Ok(until),
            Written::Refused(old) => old,
        };
        // Otherwise the machine decides (a lease already longer, or one
        // outgrowing the retention), written on the item's version.
        for _ in 0..MAX_RACES {
            let seen = conflict
                .map(|i| item::decode(&i, Some(&lease.id)))
                .transpose()?
                .ok_or(StoreError::LeaseLost)?;
            let now = self.now();
            let next = machine::decide_write(
                Some(&seen.record),
                lease.token,
                Write::Extend { lease: duration },
                now,
            )?;
            let State::InProgress { lease_until, .. } = next.state else {
                unreachable!("an extended record stays in progress")
            };
            if next == seen.record {
                return Ok(lease_until);
            }
            let journal = seen.journal.clone();
            conflict = match self
                .replace(&lease.id, Some(&seen), &next, seen.nonce, journal)
                .await?
            {
                Written::Done(_) => return Ok(lease_until),
                Written::Refused(old) => old,
            };
        }
        Err(StoreError::Backend(
            "extend lost too many races on its item".into(),
        ))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.held_write(
            lease,
            "SET st = :r, ua = :now, wn = :wn, v = v + :one REMOVE tk, lu, fc, fm",
            HashMap::from([(":r".to_owned(), s("r"))]),
        )
        .await
    }

    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        idem::poll_while(timeout, || async {
            matches!(self.live(id).await, Ok(Some(s)) if s.record.state.kind() == idem::StateKind::InProgress)
        })
        .await;
    }

    fn step_journal(&self) -> Option<Arc<dyn idem::DynStepJournal>> {
        Some(idem::journal_of(self.clone()))
    }
}

/// The lease a claim handed out, rebuilt from the record it wrote.
fn acquired(id: &RecordId, record: &Record, takeover: bool) -> ClaimOutcome {
    let State::InProgress { token, lease_until } = record.state else {
        unreachable!("checked in progress")
    };
    ClaimOutcome::Acquired(Lease {
        id: id.clone(),
        token,
        fence: record.fence,
        attempt: record.attempt,
        takeover,
        lease_until,
    })
}

impl GetRecord for DynamoStore {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        Ok(self.live(id).await?.map(|s| s.record))
    }
}

impl RecordTtl for DynamoStore {
    async fn ttl(&self, id: &RecordId, response: &[u8]) -> Result<Option<Duration>, StoreError> {
        let now = self.now();
        Ok(self
            .live(id)
            .await?
            .filter(|s| s.record.state.completed_with(response))
            .map(|s| s.record.expires_at.since(now)))
    }
}

impl DeleteRecord for DynamoStore {
    /// Leaves a tombstone (expired, released, empty journal) that keeps the
    /// fence, so the next claim's fence is higher; DynamoDB's TTL removes
    /// it after the grace, and so does [`PurgeExpired`].
    async fn delete(&self, id: &RecordId) -> Result<bool, StoreError> {
        let now = self.now();
        let values = HashMap::from([
            (":r".to_owned(), s("r")),
            (":zero".to_owned(), n(0)),
            (":now".to_owned(), n(now.as_millis())),
            (":ttl".to_owned(), n(item::ttl(now, self.grace_secs()))),
            (":one".to_owned(), n(1)),
            (":empty".to_owned(), AttributeValue::M(HashMap::new())),
        ]);
        let op = Update {
            update:
                "SET st = :r, ex = :zero, sweep_at = :ttl, ua = :now, j = :empty, v = v + :one \
                     REMOVE tk, lu, rs, rz, fc, fm, wn",
            condition: "attribute_exists(pk)",
            values,
            names: HashMap::new(),
            returns: ReturnValue::AllOld,
        };
        match self.update(id, op).await? {
            Written::Done(old) => {
                let old = old.map(|i| item::decode(&i, Some(id))).transpose()?;
                Ok(old.is_some_and(|o| !o.record.is_expired(now)))
            }
            Written::Refused(_) => Ok(false),
        }
    }
}

impl ListRecords for DynamoStore {
    /// Lists with a consistent scan of the whole table, filtered by
    /// DynamoDB and sorted here: each page costs a full scan, so this is
    /// for administration, not hot paths.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let mut filter = vec!["attribute_exists(pk)".to_owned()];
        let mut values = HashMap::new();
        if let Some(scope) = &query.scope {
            filter.push("s = :s".into());
            values.insert(":s".to_owned(), s(scope.as_str()));
        }
        if let Some(state) = query.state {
            filter.push("st = :st".into());
            values.insert(":st".to_owned(), s(state_code(state)));
        }
        let found = self
            .scan_live(&filter.join(" AND "), values, self.now())
            .await?
            .into_iter()
            .map(|s| (s.id, s.record))
            .filter(|(id, _)| query.after.as_ref().is_none_or(|after| id > after))
            .collect();
        Ok(ListPage::first_of(found, query.limit))
    }
}

fn state_code(state: idem::StateKind) -> &'static str {
    match state {
        idem::StateKind::InProgress => "p",
        idem::StateKind::Completed => "c",
        idem::StateKind::Failed => "f",
        idem::StateKind::Released => "r",
    }
}

impl PurgeExpired for DynamoStore {
    /// Deletes expired items (tombstones included), each on the condition
    /// that it is still expired at the version seen, and that its fence is
    /// older than `grace` by this clock: a later claim takes its fence from
    /// its own clock, which must then still be past the fence even if it
    /// runs behind this one (by less than `grace`), as for DynamoDB's TTL.
    /// Successive calls walk the table from where the last one stopped; a
    /// call that reaches the end starts the next walk over. DynamoDB's TTL
    /// does the same work for free, later.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        let now = self.now();
        let floor = now
            .saturating_sub(self.inner.settings.grace)
            .as_millis()
            .saturating_mul(1000);
        let mut purged = 0;
        let mut from = self.inner.purge_from.lock().take();
        while purged < limit {
            let out = self
                .inner
                .client
                .scan()
                .table_name(&self.inner.table)
                .consistent_read(true)
                .filter_expression("ex <= :now AND fe < :floor")
                .projection_expression("pk, v")
                .expression_attribute_values(":now", n(now.as_millis()))
                .expression_attribute_values(":floor", n(floor))
                .set_exclusive_start_key(
                    from.take()
                        .map(|pk| HashMap::from([("pk".to_owned(), s(pk))])),
                )
                .limit(500)
                .send()
                .await
                .map_err(map_err)?;
            for found in out.items() {
                if purged == limit {
                    break;
                }
                let (Some(pk), Some(v)) = (
                    found.get("pk").and_then(|v| v.as_s().ok()),
                    found.get("v").and_then(|v| v.as_n().ok()),
                ) else {
                    continue;
                };
                from = Some(pk.clone());
                let deleted = self
                    .inner
                    .client
                    .delete_item()
                    .table_name(&self.inner.table)
                    .key("pk", s(pk.clone()))
                    .condition_expression("v = :v AND ex <= :now AND fe < :floor")
                    .expression_attribute_values(":v", AttributeValue::N(v.clone()))
                    .expression_attribute_values(":now", n(now.as_millis()))
                    .expression_attribute_values(":floor", n(floor))
                    .send()
                    .await;
                match deleted {
                    Ok(_) => purged += 1,
                    Err(SdkError::ServiceError(e))
                        if e.err().is_conditional_check_failed_exception() => {}
                    Err(e) => {
                        *self.inner.purge_from.lock() = from;
                        return Err(map_err(e));
                    }
                }
            }
            let Some(last) = out
                .last_evaluated_key
                .and_then(|k| k.get("pk").and_then(|v| v.as_s().ok()).cloned())
            else {
                // The end of the table: the next call starts over.
                return Ok(purged);
            };
            if purged < limit {
                from = Some(last);
            }
        }
        *self.inner.purge_from.lock() = from;
        Ok(purged)
    }
}

impl FindAbandoned for DynamoStore {
    /// Scans the table for the scope's in-progress records whose lease ran
    /// out, longest-abandoned first. A full scan per call: run it on the
    /// completer's schedule, not per request.
    async fn abandoned(
        &self,
        scope: &Scope,
        limit: usize,
    ) -> Result<Vec<(RecordId, Record)>, StoreError> {
        let values = HashMap::from([
            (":s".to_owned(), s(scope.as_str())),
            (":p".to_owned(), s("p")),
        ]);
        let mut found = self
            .scan_live("s = :s AND st = :p AND lu <= :now", values, self.now())
            .await?;
        found.sort_by_key(|s| match s.record.state {
            State::InProgress { lease_until, .. } => lease_until,
            _ => Timestamp::ZERO,
        });
        Ok(found
            .into_iter()
            .take(limit)
            .map(|s| (s.id, s.record))
            .collect())
    }
}

impl StepJournal for DynamoStore {
    async fn begin_step(&self, lease: &Lease, step: &str) -> Result<StepBegin, StoreError> {
        let now = self.now();
        let nonce = self.inner.mint.next();
        let mut values = held_values(lease, now);
        values.insert(":started".to_owned(), item::started(lease.attempt, nonce));
        let op = Update {
            update: "SET j.#n = :started, v = v + :one",
            condition: &format!(
                "{HELD} AND (attribute_not_exists(j.#n) OR attribute_exists(j.#n.a))"
            ),
            values,
            names: HashMap::from([("#n".to_owned(), step.to_owned())]),
            returns: ReturnValue::UpdatedOld,
        };
        match self.update(&lease.id, op).await? {
            Written::Done(old) => {
                let before = old
                    .as_ref()
                    .and_then(|o| o.get("j"))
                    .and_then(|j| j.as_m().ok())
                    .and_then(|j| j.get(step));
                let Some(before) = before else {
                    return Ok(StepBegin::Fresh);
                };
                let before = item::decode_step(before).map_err(|reason| StoreError::Corrupt {
                    id: lease.id.to_string(),
                    reason,
                })?;
                match before {
                    // Our own mark: the SDK retried this request after its answer was lost.
                    Step::Started { nonce: mark, .. } if mark == nonce => Ok(StepBegin::Fresh),
                    Step::Started { attempt, .. } => {
                        Ok(idem::machine::step_begun(attempt, lease.attempt))
                    }
                    Step::Done(result) => Ok(StepBegin::Done(result)),
                }
            }
            Written::Refused(old) => {
                let old = old.map(|i| item::decode(&i, Some(&lease.id))).transpose()?;
                let old = old.filter(|o| machine::held(Some(&o.record), lease.token, now).is_ok());
                match old.as_ref().map(|o| o.step(step)).transpose()?.flatten() {
                    Some(Step::Done(result)) => Ok(StepBegin::Done(result)),
                    _ => Err(StoreError::LeaseLost),
                }
            }
        }
    }

    async fn finish_step(
        &self,
        lease: &Lease,
        step: &str,
        result: Bytes,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut values = held_values(lease, now);
        values.insert(":done".to_owned(), item::done(&result));
        let op = Update {
            update: "SET j.#n = :done, v = v + :one",
            condition: HELD,
            values,
            names: HashMap::from([("#n".to_owned(), step.to_owned())]),
            returns: ReturnValue::None,
        };
        match self.update(&lease.id, op).await? {
            Written::Done(_) => Ok(()),
            Written::Refused(_) => Err(StoreError::LeaseLost),
        }
    }

    async fn steps(&self, id: &RecordId) -> Result<Vec<StepEntry>, StoreError> {
        match self.live(id).await? {
            Some(stored) => stored.steps(),
            None => Ok(Vec::new()),
        }
    }

    async fn resolve_step(
        &self,
        id: &RecordId,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        for _ in 0..MAX_RACES {
            let now = self.now();
            let seen = self.read(id).await?;
            let current = match &seen {
                Some(seen) => seen.step(step)?.map(|s| match s {
                    Step::Started { attempt, .. } => idem::StepState::Started { attempt },
                    Step::Done(result) => idem::StepState::Done { result },
                }),
                None => None,
            };
            let (record, new_step) = match machine::decide_resolve(
                seen.as_ref().map(|s| &s.record),
                current.as_ref(),
                resolution.clone(),
                now,
            ) {
                Ok(decided) => decided,
                Err(answer) => return Ok(answer),
            };
            let seen = seen.expect("a resolution needs a record");
            let mut journal = seen.journal.clone();
            match &new_step {
                Some(state) => journal.insert(step.to_owned(), item::step_value(state)),
                None => journal.remove(step),
            };
            if let Written::Done(_) = self
                .replace(id, Some(&seen), &record, None, journal)
                .await?
            {
                return Ok(Resolved::Released);
            }
        }
        Err(StoreError::Backend(
            "resolve lost too many races on its item".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::transient_code;

    #[test]
    fn throttling_service_failures_and_transaction_conflicts_are_transient() {
        for code in [
            "ThrottlingException",
            "ProvisionedThroughputExceededException",
            "RequestLimitExceeded",
            "InternalServerError",
            "ServiceUnavailable",
            "TransactionConflictException",
            "ReplicatedWriteConflictException",
        ] {
            assert!(transient_code(code), "{code}");
        }
        for code in [
            "ValidationException",
            "ResourceNotFoundException",
            "ConditionalCheckFailedException",
            "ItemCollectionSizeLimitExceededException",
            "AccessDeniedException",
        ] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
