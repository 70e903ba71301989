//! The outbox's pending index (`lua/pending.lua`): a sending run's mark
//! `<record key>:o` beside its record, written by its completion's script
//! (alone or in a batch), cleared by its confirmation (batched like the
//! primitives), and found by dispatchers scanning the scope's marks, each
//! taken by one script call on its record's server.

use std::time::Duration;

use bytes::Bytes;
use idem::store::{Lease, PendingRun, PendingSends};
use idem::{Key, RecordId, Scope, StoreError};
use redis::Value;

use crate::call::{Call, Op};
use crate::error::damaged;
use crate::store::{millis, written, RedisStore};

/// What a mark's key adds to its record's.
const SUFFIX: &str = ":o";

impl RedisStore {
    /// Takes each of `keys` (records whose mark may be due), in one
    /// pipeline per server: the runs taken.
    async fn take_marked(
        &self,
        keys: Vec<String>,
        hold: Duration,
    ) -> Result<Vec<PendingRun>, StoreError> {
        let hold = millis(hold).to_vec();
        let calls: Vec<(String, Vec<Vec<u8>>)> =
            keys.into_iter().map(|k| (k, vec![hold.clone()])).collect();
        let replies = self
            .run_each(&self.inner.scripts.pending_take, &calls, false)
            .await;
        let mut taken = Vec::new();
        for ((key, _), reply) in calls.iter().zip(replies) {
            let reply = reply.map_err(|e| damaged(key, e))?;
            if let Some(run) = taken_run(key, reply)? {
                taken.push(run);
            }
        }
        Ok(taken)
    }
}

/// A take's reply: `{scope, key, fence, response}`, or an empty list.
fn taken_run(key: &str, reply: Value) -> Result<Option<PendingRun>, StoreError> {
    let corrupt = |why: String| StoreError::Corrupt {
        id: key.to_owned(),
        reason: format!("pending_take replied {why}"),
    };
    let Value::Array(items) = reply else {
        return Err(corrupt(format!("{reply:?}")));
    };
    if items.is_empty() {
        return Ok(None);
    }
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => Some(b.clone()),
        _ => None,
    };
    let fields: Option<Vec<Vec<u8>>> = items.iter().map(bytes).collect();
    let Some([scope, name, fence, response]) = fields.and_then(|f| <[_; 4]>::try_from(f).ok())
    else {
        return Err(corrupt(format!("{items:?}")));
    };
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|e| corrupt(e.to_string()));
    let scope = Scope::new(&text(scope)?).map_err(|e| corrupt(e.to_string()))?;
    let name = Key::new(&text(name)?).map_err(|e| corrupt(e.to_string()))?;
    let fence = text(fence)?
        .parse()
        .map_err(|_| corrupt("a fence that is no number".into()))?;
    Ok(Some(PendingRun {
        id: RecordId::new(scope, name),
        fence,
        response: Bytes::from(response),
    }))
}

impl PendingSends for RedisStore {
    async fn complete_pending(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
        hold: Duration,
    ) -> Result<(), StoreError> {
        let mut args = self.completion_args(&lease.id, response, retention);
        args.push(millis(hold));
        let reply = self.write(Op::CompletePending, lease, args).await?;
        written(&lease.id, reply)
    }

    async fn confirm_sent(&self, id: &RecordId, fence: u64) -> Result<(), StoreError> {
        let call = Call {
            op: Op::Confirm,
            key: self.record_key(id),
            args: vec![Bytes::from(fence.to_string())],
        };
        self.primitive(call)
            .await
            .map(drop)
            .map_err(|e| damaged(id, e))
    }

    async fn take_pending(
        &self,
        scope: &Scope,
        hold: Duration,
        limit: usize,
    ) -> Result<Vec<PendingRun>, StoreError> {
        let pattern = format!("{}{SUFFIX}", self.scope_pattern(Some(scope)));
        let mut scan = self.scan_matching(pattern).await?;
        let mut taken = Vec::new();
        while taken.len() < limit {
            let Some(marks) = scan.next(&self.inner.conn).await? else {
                break;
            };
            let mut records: Vec<String> = marks
                .into_iter()
                .filter_map(|m| m.strip_suffix(SUFFIX).map(str::to_owned))
                .collect();
            // A take holds what it finds due, so no more are asked at once
            // than there is room for; the rest of the page after them.
            while !records.is_empty() && taken.len() < limit {
                let room = (limit - taken.len()).min(records.len());
                let asked: Vec<String> = records.drain(..room).collect();
                for run in self.take_marked(asked, hold).await? {
                    if run.id.scope() == scope {
                        taken.push(run);
                    }
                }
            }
        }
        Ok(taken)
    }

    async fn take_pending_run(
        &self,
        id: &RecordId,
        hold: Duration,
    ) -> Result<Option<PendingRun>, StoreError> {
        let mut taken = self.take_marked(vec![self.record_key(id)], hold).await?;
        Ok(taken.pop().filter(|run| run.id == *id))
    }
}
