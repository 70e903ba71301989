//! [`RedisStore`] and its `impl Store`: every transition one script.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem::store::{ClaimOutcome, ClaimParams, Lease, LeaseToken, TokenMint};
use idem::{Failure, RecordId, Scope, Store, StoreError, Timestamp};
use redis::Value;
use sha2::{Digest, Sha256};

use crate::call::{Call, Op};
use crate::conn::Conn;
use crate::encode;
use crate::error::{damaged, store_error};
use crate::group::Batcher;
use crate::notify::{self, Notifier};
use crate::scripts::Scripts;

/// The Redis store. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) namespace: String,
    pub(crate) grace_ms: Bytes,
    /// How long expired keys are remembered, if they are (see
    /// `horizon.rs`).
    pub(crate) memory: Option<Duration>,
    /// [`memory`](Self::memory) as the scripts take it (`0` for none).
    pub(crate) memory_ms: Bytes,
    pub(crate) tokens: TokenMint,
    pub(crate) scripts: Arc<Scripts>,
    /// Sends the primitives in batches (a single server, unless turned
    /// off).
    pub(crate) batcher: Option<Arc<Batcher>>,
    /// Wakes callers waiting for a record's outcome.
    pub(crate) notifier: Notifier,
}

impl RedisStore {
    /// Whether this store talks to a Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.conn, Conn::Cluster(_))
    }

    /// The key prefix.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The SHA-1 of the claim script, as `EVALSHA` takes it (for
    /// `redis-benchmark`). Its arguments are listed in `lua/claim.lua`.
    pub fn claim_script_sha(&self) -> &str {
        self.inner.scripts.claim_sha()
    }

    /// The Redis key holding `id`'s record:
    /// `namespace:<scope hash>:{<id hash>}`. The braces make the id hash
    /// the record's Cluster hash tag; the scope hash lets a list by scope
    /// scan only that scope's keys.
    pub fn record_key(&self, id: &RecordId) -> String {
        let scope = Sha256::digest(id.scope().as_str().as_bytes());
        let mut whole = Sha256::new();
        whole.update(id.scope().as_str().as_bytes());
        whole.update([0]);
        whole.update(id.key().as_str().as_bytes());
        format!(
            "{}:{}:{{{}}}",
            self.inner.namespace,
            hex::encode(&scope[..8]),
            hex::encode(&whole.finalize()[..16])
        )
    }

    pub(crate) fn scope_pattern(&self, scope: Option<&Scope>) -> String {
        match scope {
            Some(scope) => {
                let hash = Sha256::digest(scope.as_str().as_bytes());
                format!("{}:{}:*}}", self.inner.namespace, hex::encode(&hash[..8]))
            }
            None => format!("{}:*}}", self.inner.namespace),
        }
    }

    pub(crate) fn fresh_token(&self) -> LeaseToken {
        self.inner.tokens.next()
    }

    pub(crate) async fn claim_one(
        &self,
        id: &RecordId,
        params: &ClaimParams,
    ) -> Result<ClaimOutcome, StoreError> {
        let token = self.fresh_token();
        let reply = self
            .primitive(self.claim_call(id, token, params))
            .await
            .map_err(|e| damaged(id, e))?;
        encode::claim_outcome(id, token, reply)
    }

    /// The claim of `id` with `token`, as the claim script takes it.
    pub(crate) fn claim_call(
        &self,
        id: &RecordId,
        token: LeaseToken,
        params: &ClaimParams,
    ) -> Call {
        let text = |s: String| Bytes::from(s);
        Call {
            op: Op::Claim,
            key: self.record_key(id),
            args: vec![
                text(token.to_hex()),
                text(params.fingerprint.map(|f| f.to_hex()).unwrap_or_default()),
                millis(params.lease),
                millis(params.retention),
                Bytes::copy_from_slice(id.scope().as_str().as_bytes()),
                Bytes::copy_from_slice(id.key().as_str().as_bytes()),
                self.inner.grace_ms.clone(),
                self.memory_arg(id),
            ],
        }
    }

    /// Runs one primitive: in the next batch on a single server, or as a
    /// script call of its own (a Cluster, or batching turned off).
    pub(crate) async fn primitive(&self, call: Call) -> Result<Value, StoreError> {
        if let Some(batcher) = &self.inner.batcher {
            return batcher.call(call).await;
        }
        self.inner
            .scripts
            .primitive(call.op)
            .run(
                &self.inner.conn,
                &call.key,
                &call.arg_slices(),
                self.remembers(),
            )
            .await
            .map_err(store_error)
    }

    /// Runs a holder's write; `Ok(reply)` when the token held.
    pub(crate) async fn write(
        &self,
        op: Op,
        lease: &Lease,
        args: Vec<Bytes>,
    ) -> Result<Value, StoreError> {
        self.primitive(self.holder_call(op, lease, args))
            .await
            .map_err(|e| damaged(&lease.id, e))
    }

    /// A holder's write as its script takes it: the token, then `args`.
    pub(crate) fn holder_call(&self, op: Op, lease: &Lease, args: Vec<Bytes>) -> Call {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(Bytes::from(lease.token.to_hex()));
        all.extend(args);
        Call {
            op,
            key: self.record_key(&lease.id),
            args: all,
        }
    }

    /// The completion's arguments after the token.
    pub(crate) fn completion_args(
        &self,
        id: &RecordId,
        response: Bytes,
        retention: Duration,
    ) -> Vec<Bytes> {
        vec![
            response,
            millis(retention),
            self.inner.grace_ms.clone(),
            self.memory_arg(id),
        ]
    }
}

impl Store for RedisStore {
    idem::store_capabilities!(peek, steps, pending);

    async fn claim(&self, id: &RecordId, params: &ClaimParams) -> Result<ClaimOutcome, StoreError> {
        self.claim_one(id, params).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: Bytes,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let args = self.completion_args(&lease.id, response, retention);
        let reply = self.write(Op::Complete, lease, args).await?;
        written(&lease.id, reply)
    }

    async fn fail(
        &self,
        lease: &Lease,
        failure: Failure,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let args = vec![
            Bytes::from_static(failure.class.as_str().as_bytes()),
            Bytes::from(failure.message),
            millis(retention),
            self.inner.grace_ms.clone(),
            self.memory_arg(&lease.id),
        ];
        let reply = self.write(Op::Fail, lease, args).await?;
        written(&lease.id, reply)
    }

    async fn extend(&self, lease: &Lease, duration: Duration) -> Result<Timestamp, StoreError> {
        let args = vec![millis(duration), self.inner.grace_ms.clone()];
        let reply = self.write(Op::Extend, lease, args).await?;
        match reply {
            Value::Int(n) if n < 0 => Err(StoreError::LeaseLost),
            Value::Int(n) => Ok(Timestamp::from_millis(n.unsigned_abs())),
            other => Err(StoreError::Corrupt {
                id: lease.id.to_string(),
                reason: format!("extend replied {other:?}"),
            }),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let reply = self.write(Op::Release, lease, Vec::new()).await?;
        written(&lease.id, reply)
    }

    /// Waits for the record's end to be published (see the crate docs) or
    /// `timeout`; returns at once if the record is not in progress. The
    /// caller claims again either way; the claim decides.
    async fn wait_for_change(&self, id: &RecordId, timeout: Duration) {
        let key = self.record_key(id);
        let channel = notify::channel(&key);
        self.inner
            .notifier
            .wait(channel, timeout, || async {
                // Marks the record so that its end publishes (`lua/watch.lua`).
                let watched = self
                    .inner
                    .scripts
                    .watch
                    .run(&self.inner.conn, &key, &[], false)
                    .await;
                matches!(watched, Ok(Value::Int(1)))
            })
            .await;
    }
}

/// A duration in milliseconds, as the scripts take it: at most
/// [`idem::store::LONGEST_HELD`], since a later time overflows the scripts'
/// integer formatting and `PEXPIREAT` (a negative time deletes the key).
pub(crate) fn millis(d: Duration) -> Bytes {
    Bytes::from(idem::store::held(d).as_millis().to_string())
}

/// A holder's write replied 1 (written) or 0 (lease lost).
pub(crate) fn written(id: &RecordId, reply: Value) -> Result<(), StoreError> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(StoreError::LeaseLost),
        other => Err(StoreError::Corrupt {
            id: id.to_string(),
            reason: format!("write replied {other:?}"),
        }),
    }
}
