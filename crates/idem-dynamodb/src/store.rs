//! [`DynamoStore`] and its `impl Store`: every transition one conditional
//! write, decided by [`idem::machine`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use aws_sdk_dynamodb::Client;
use bytes::Bytes;
use idem::machine::{self, ClaimDecision, Fresh, Write};
use idem::store::{ClaimOutcome, ClaimParams, Lease, TokenMint};
use idem::{
    Clock, Failure, FailureClass, Record, RecordId, State, Store, StoreError, SystemClock,
    Timestamp,
};

use crate::encode::Encoding;
use crate::encode::{self, n, s, Item, Stored};
use crate::error::ItemTooLarge;
use crate::horizon;
use crate::request::{held_values, Table, Update, Written, HELD};

/// What a record's item holds besides its response, at most (names,
/// numbers, token, fingerprint, failure): the room a response must leave.
const RECORD_OVERHEAD: usize = 1024;

/// How many times a claim re-decides after losing a race on the item
/// before it gives up. Every lost race means another writer won, so a
/// handful is plenty; the bound only stops a livelock.
pub(crate) const MAX_RACES: usize = 64;

/// How long an item stays in DynamoDB past its retention by default, so a
/// key claimed again soon after expiry still finds the fence to build on.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// Responses longer than this are stored compressed (when that is shorter).
pub const DEFAULT_COMPRESS_ABOVE: usize = 1024;

/// What the builder and the `with_*` methods set.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) grace: Duration,
    pub(crate) encoding: Encoding,
    /// How long the keys of records this store ends are remembered
    /// ([`crate::horizon`]); `None`: not at all.
    pub(crate) memory: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            grace: DEFAULT_GRACE,
            encoding: Encoding {
                compress_above: DEFAULT_COMPRESS_ABOVE,
            },
            memory: None,
        }
    }
}

/// The DynamoDB store. Cheap to clone; clones share the client.
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) table: Table,
    pub(crate) settings: Settings,
    pub(crate) mint: TokenMint,
    /// Where the last purge left off (a partition key), so purges walk the
    /// whole table in turn instead of rescanning its start.
    pub(crate) purge_from: parking_lot::Mutex<Option<String>>,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.inner.table.name)
            .field("grace", &self.inner.settings.grace)
            .finish_non_exhaustive()
    }
}

impl DynamoStore {
    pub(crate) fn encode(
        &self,
        id: &RecordId,
        record: &Record,
        version: u64,
        nonce: Option<idem::store::LeaseToken>,
    ) -> Item {
        encode::encode(
            id,
            record,
            version,
            nonce,
            self.grace_secs(),
            self.inner.settings.encoding,
        )
    }

    /// Refuses an item of `size` bytes over DynamoDB's limit.
    pub(crate) fn check_size(id: &RecordId, size: usize) -> Result<(), StoreError> {
        if size > encode::ITEM_LIMIT {
            return Err(StoreError::Backend(Box::new(ItemTooLarge {
                id: id.to_string(),
                size,
                limit: encode::ITEM_LIMIT,
            })));
        }
        Ok(())
    }

    /// The live record of `id`, or `None`.
    pub(crate) async fn live(&self, id: &RecordId) -> Result<Option<Stored>, StoreError> {
        let now = self.now();
        Ok(self
            .inner
            .table
            .read(id)
            .await?
            .filter(|s| !s.record.is_expired(now)))
    }

    /// Writes `record` over the item `seen` (with `journal`, and the
    /// memory `seen` keeps), on the condition that the item is still at `seen`'s
    /// version (or still absent).
    pub(crate) async fn replace(
        &self,
        id: &RecordId,
        seen: Option<&Stored>,
        record: &Record,
        nonce: Option<idem::store::LeaseToken>,
        journal: HashMap<String, AttributeValue>,
    ) -> Result<Written, StoreError> {
        let version = seen.map_or(1, |s| s.version + 1);
        let mut item = self.encode(id, record, version, nonce);
        item.insert("j".into(), AttributeValue::M(journal));
        if let Some(seen) = seen {
            horizon::carry(&mut item, seen);
        }
        Self::check_size(id, encode::size(&item))?;
        match seen {
            None => {
                self.inner
                    .table
                    .put(item, "attribute_not_exists(pk)", HashMap::new())
                    .await
            }
            Some(seen) => {
                let values = HashMap::from([(":v".to_owned(), n(seen.version))]);
                self.inner.table.put(item, "v = :v", values).await
            }
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table.name
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.inner.table.client
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.inner.settings.clock.now()
    }

    pub(crate) fn grace_secs(&self) -> u64 {
        self.inner.settings.grace.as_secs()
    }

    /// The first try of a claim: creates the item if it is absent or
    /// expired (its fence below ours, and no memory that still runs:
    /// [`horizon::CLAIMABLE`]).
    pub(crate) async fn claim_fresh(
        &self,
        id: &RecordId,
        record: &Record,
        now: Timestamp,
    ) -> Result<Written, StoreError> {
        let mut item = self.encode(id, record, 1, None);
        item.insert("j".into(), AttributeValue::M(HashMap::new()));
        Self::check_size(id, encode::size(&item))?;
        let values = HashMap::from([
            (":now".to_owned(), n(now.as_millis())),
            (":fe".to_owned(), n(record.fence)),
        ]);
        self.inner.table.put(item, horizon::CLAIMABLE, values).await
    }

    /// A holder's write: `update` (which must set `wn = :wn`) on the
    /// condition that `lease` still holds the record. A refusal is
    /// `LeaseLost`, unless the returned item carries this write's nonce:
    /// then the write had landed and this was the SDK retrying it after its
    /// answer was lost. A caller repeating a write sends a new nonce, so it
    /// is refused as it must be.
    pub(crate) async fn held_write(
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
        match self.inner.table.update(&lease.id, op).await? {
            Written::Done(_) => Ok(()),
            Written::Refused(old) => {
                let old = old
                    .map(|i| encode::decode(&i, Some(&lease.id)))
                    .transpose()?;
                match old {
                    Some(old) if old.nonce == Some(nonce) => Ok(()),
                    _ => Err(StoreError::LeaseLost),
                }
            }
        }
    }

    pub(crate) fn fresh(&self, now: Timestamp) -> Fresh {
        Fresh {
            token: self.inner.mint.next(),
            fence_floor: now.as_millis().saturating_mul(1000),
        }
    }
}

impl Store for DynamoStore {
    idem::store_capabilities!(peek, steps);

    /// DynamoDB's 400 KB item, less the record's other attributes (the
    /// step journal shares the item and is not counted: DynamoDB refuses
    /// a response that fits alone but not beside it).
    fn max_stored_bytes(&self) -> Option<usize> {
        Some(encode::ITEM_LIMIT - RECORD_OVERHEAD)
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
            let seen = conflict.map(|i| encode::decode(&i, Some(id))).transpose()?;
            if let Some(seen) = &seen {
                if matches!(seen.record.state, State::InProgress { token, .. } if token == fresh.token)
                {
                    // Our own write, which the SDK retried after its answer was lost.
                    return Ok(acquired(id, &seen.record, last_takeover));
                }
            }
            let now = self.now();
            if let Some(late) = seen
                .as_ref()
                .and_then(|seen| horizon::late_retry(id, seen, params, now))
            {
                return Ok(late);
            }
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
        let (remember, memory, ttl) = self.ending(&lease.id, ex);
        // The response is set first. The step journal shares the item, so
        // DynamoDB can still refuse the write as too large; its UpdateItem
        // is atomic, but moto (the tests' DynamoDB) applies an update's
        // actions one by one and keeps those before the one that
        // overflowed, which would leave "completed" without a response.
        let update = format!(
            "SET {attr} = :r, st = :c, ex = :ex, sweep_at = :ttl, ua = :now, wn = :wn, v = v + :one\
             {remember} REMOVE tk, lu, fc, fm"
        );
        let mut values = HashMap::from([
            (":c".to_owned(), s("c")),
            (":r".to_owned(), value),
            (":ex".to_owned(), n(ex.as_millis())),
            (":ttl".to_owned(), n(ttl)),
        ]);
        values.extend(memory.into_iter().map(|(k, v)| (k.to_owned(), v)));
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
        // A retryable failure releases the record: it never ended, and is
        // not remembered.
        let (state, (remember, memory, ttl)) = if failure.class == FailureClass::Retryable {
            ("r", ("", Vec::new(), encode::ttl(ex, self.grace_secs())))
        } else {
            ("f", self.ending(&lease.id, ex))
        };
        let mut values = HashMap::from([
            (":st".to_owned(), s(state)),
            (":fc".to_owned(), s(failure.class.as_str())),
            (":fm".to_owned(), s(failure.message.clone())),
            (":ex".to_owned(), n(ex.as_millis())),
            (":ttl".to_owned(), n(ttl)),
        ]);
        values.extend(memory.into_iter().map(|(k, v)| (k.to_owned(), v)));
        let update = format!(
            "SET st = :st, fc = :fc, fm = :fm, ex = :ex, sweep_at = :ttl, ua = :now, wn = :wn, \
             v = v + :one{remember} REMOVE tk, lu"
        );
        self.held_write(lease, &update, values).await
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
        let mut conflict = match self.inner.table.update(&lease.id, op).await? {
            Written::Done(_) => return Ok(until),
            Written::Refused(old) => old,
        };
        // Otherwise the machine decides (a lease already longer, or one
        // outgrowing the retention), written on the item's version.
        for _ in 0..MAX_RACES {
            let seen = conflict
                .map(|i| encode::decode(&i, Some(&lease.id)))
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
        idem::store::poll_while(timeout, || async {
            matches!(self.live(id).await, Ok(Some(s)) if s.record.state.kind() == idem::StateKind::InProgress)
        })
        .await;
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
