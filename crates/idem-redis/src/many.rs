//! Batches: claims and completions sent together, one primitive's calls
//! at a time.

use std::collections::HashMap;

use idem::{ClaimMany, CompleteMany, RecordId, StoreError};

use idem::store::{ClaimOutcome, ClaimParams, Completion, LeaseToken};
use redis::Value;

use crate::call::{Call, Op};
use crate::conn::Conn;
use crate::error::{damaged, store_error};
use crate::store::{millis, written, RedisStore};
use crate::{conn, encode, scripts};

impl RedisStore {
    /// Runs `calls` together, replies in order: in one batch on a single
    /// server, else each primitive's calls grouped by slot (see
    /// [`run_each`](Self::run_each)), one primitive after another.
    async fn primitives(&self, calls: Vec<Call>) -> Vec<Result<Value, StoreError>> {
        if let Some(batcher) = &self.inner.batcher {
            return batcher.call_all(calls).await;
        }
        let mut replies: Vec<Option<Result<Value, StoreError>>> =
            calls.iter().map(|_| None).collect();
        for op in Op::ALL {
            let at: Vec<usize> = (0..calls.len()).filter(|&i| calls[i].op == op).collect();
            let same: Vec<(String, Vec<Vec<u8>>)> = at
                .iter()
                .map(|&i| {
                    let args = calls[i].args.iter().map(|a| a.to_vec()).collect();
                    (calls[i].key.clone(), args)
                })
                .collect();
            if same.is_empty() {
                continue;
            }
            let script = self.inner.scripts.primitive(op);
            let done = self.run_each(script, &same, self.remembers()).await;
            for (i, reply) in at.into_iter().zip(done) {
                replies[i] = Some(reply);
            }
        }
        replies
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(StoreError::Backend("a call got no reply".into()))))
            .collect()
    }
}

impl ClaimMany for RedisStore {
    /// Sends the claims together: one pipeline to a single server; on a
    /// Cluster, grouped by slot, the groups all at once (each node's
    /// connection pipelines its share). Claims of one key are answered in
    /// the order given.
    async fn claim_many(
        &self,
        claims: &[(RecordId, ClaimParams)],
    ) -> Result<Vec<Result<ClaimOutcome, StoreError>>, StoreError> {
        let tokens: Vec<LeaseToken> = claims.iter().map(|_| self.fresh_token()).collect();
        let calls: Vec<Call> = claims
            .iter()
            .zip(&tokens)
            .map(|((id, params), token)| self.claim_call(id, *token, params))
            .collect();
        let replies = self.primitives(calls).await;
        Ok(claims
            .iter()
            .zip(tokens)
            .zip(replies)
            .map(|(((id, _), token), reply)| {
                encode::claim_outcome(id, token, reply.map_err(|e| damaged(id, e))?)
            })
            .collect())
    }
}

impl CompleteMany for RedisStore {
    /// Sends the completions together, as [`ClaimMany`] sends claims: one
    /// batch script call to a single server (group commit, see the crate
    /// docs), grouped by slot on a Cluster. Each is checked against its
    /// own token.
    async fn complete_many(
        &self,
        completions: &[Completion],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let calls: Vec<Call> = completions
            .iter()
            .map(|c| {
                let mut args = self.completion_args(&c.lease.id, c.response.clone(), c.retention);
                match c.pending {
                    None => self.holder_call(Op::Complete, &c.lease, args),
                    Some(hold) => {
                        args.push(millis(hold));
                        self.holder_call(Op::CompletePending, &c.lease, args)
                    }
                }
            })
            .collect();
        let replies = self.primitives(calls).await;
        Ok(completions
            .iter()
            .zip(replies)
            .map(|(c, reply)| written(&c.lease.id, reply.map_err(|e| damaged(&c.lease.id, e))?))
            .collect())
    }
}
impl RedisStore {
    /// Runs `script` on each key and returns the replies in order. On a
    /// single server the calls go out as one pipeline. On a Cluster they
    /// are grouped by slot: the groups go out all at once (so each node's
    /// connection pipelines them), and the calls of one group one after
    /// another, each routed on its own so that ASK and MOVED answers are
    /// followed. Calls on the same key share a slot, so they run in the
    /// order given, as single calls would. Errors come as the server gave
    /// them: the caller knows what to name a damaged record by.
    /// `remembering`: the script may touch the records' memories, which a
    /// Cluster then declares ([`Script::run`](scripts::Script::run)).
    pub(crate) async fn run_each(
        &self,
        script: &scripts::Script,
        calls: &[(String, Vec<Vec<u8>>)],
        remembering: bool,
    ) -> Vec<Result<Value, StoreError>> {
        let Conn::Standalone(server) = &self.inner.conn else {
            let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
            for (i, (key, _)) in calls.iter().enumerate() {
                by_slot
                    .entry(conn::slots::slot(key.as_bytes()))
                    .or_default()
                    .push(i);
            }
            let groups = by_slot.into_values().map(|group| async move {
                let mut out = Vec::with_capacity(group.len());
                for i in group {
                    let (key, args) = &calls[i];
                    let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    let result = script.run(&self.inner.conn, key, &args, remembering).await;
                    out.push((i, result.map_err(store_error)));
                }
                out
            });
            let mut done: Vec<_> = futures_util::future::join_all(groups)
                .await
                .into_iter()
                .flatten()
                .collect();
            done.sort_unstable_by_key(|(i, _)| *i);
            return done.into_iter().map(|(_, result)| result).collect();
        };
        self.pipeline(server, script, calls).await
    }

    /// All `calls` as one pipeline to a single server. A call the server
    /// refused without running it (the script not loaded there, after a
    /// restart) runs again on its own, in order.
    async fn pipeline(
        &self,
        server: &conn::Server,
        script: &scripts::Script,
        calls: &[(String, Vec<Vec<u8>>)],
    ) -> Vec<Result<Value, StoreError>> {
        let mut pipe = redis::pipe();
        for (key, args) in calls {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            pipe.add_command(script.evalsha(key, &args));
        }
        pipe.ignore_errors();
        let replies = server.query_pipe(pipe).await;
        let replies = match replies {
            Ok(replies) if replies.len() == calls.len() => replies,
            Ok(replies) => {
                let reason = format!("a pipeline of {} answered {}", calls.len(), replies.len());
                return calls
                    .iter()
                    .map(|_| Err(StoreError::Backend(reason.clone().into())))
                    .collect();
            }
            Err(e) => {
                let e = store_error(e);
                return calls.iter().map(|_| Err(e.copy())).collect();
            }
        };
        let mut out = Vec::with_capacity(calls.len());
        for ((key, args), reply) in calls.iter().zip(replies) {
            out.push(match reply {
                Err(e) if scripts::is_noscript(&e) => {
                    let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    script
                        .run(&self.inner.conn, key, &args, false)
                        .await
                        .map_err(store_error)
                }
                other => other.map_err(store_error),
            });
        }
        out
    }
}
