//! Group commit on one server ([`idem::group`]): the primitives that
//! callers make at the same time go to Redis together, as one call of the
//! batch script (`lua/batch.lua`), instead of one script call each; a lone
//! call runs its primitive's own script at once.
//!
//! Each call is still atomic on its own. Calls submitted together (the
//! claims of one `claim_many`) go in one batch and run in their order;
//! calls of different callers are concurrent, as they are without
//! batching. A call that raises an error in the script fails alone; the
//! rest of its batch runs. A batch that gets no answer fails every call in
//! it with the same error, as each single call would have failed.

use std::sync::Arc;

use idem::group::{Batch, GroupCommit, Limits};
use idem::StoreError;
use redis::Value;

use crate::call::Call;
use crate::conn::Server;
use crate::error::{store_error, transient_code};
use crate::scripts::{Script, Scripts};
use crate::shared::Shared;

/// The batch form of the primitives on one server: one call of the batch
/// script for many calls, each call's own script for a lone call.
pub(crate) struct Scripted {
    server: Server,
    batch: Script,
    scripts: Arc<Scripts>,
}

/// The group commit of one server.
pub(crate) type Batcher = GroupCommit<Scripted>;

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripted").finish_non_exhaustive()
    }
}

impl Scripted {
    /// The group commit of `server`, running `scripts`' primitives.
    pub(crate) fn group(server: Server, scripts: Arc<Scripts>) -> Arc<Batcher> {
        GroupCommit::new(
            Self {
                server,
                batch: crate::scripts::batch(),
                scripts,
            },
            Limits::default(),
        )
    }

    /// The batch script, for loading it ahead.
    pub(crate) fn script(&self) -> &Script {
        &self.batch
    }
}

impl Batch for Scripted {
    type Call = Call;
    type Reply = Result<Value, StoreError>;

    async fn one(&self, call: Call) -> Result<Value, StoreError> {
        self.scripts
            .primitive(call.op)
            .run_on(&self.server, &call.key, &call.arg_slices())
            .await
            .map_err(store_error)
    }

    /// One script call for `calls`. The script reads each call's arguments
    /// by its arity, so a call with another number (a bug) would shift
    /// every later call's: such a call is answered with an error and left
    /// out.
    async fn many(&self, calls: Vec<Call>) -> Vec<Result<Value, StoreError>> {
        let out: Vec<Option<Result<Value, StoreError>>> = calls
            .iter()
            .map(|call| {
                (call.args.len() != call.op.arity()).then(|| {
                    let reason = format!(
                        "{:?} takes {} arguments, not {}",
                        call.op,
                        call.op.arity(),
                        call.args.len()
                    );
                    Err(StoreError::Backend(reason.into()))
                })
            })
            .collect();
        let sent: Vec<&Call> = calls
            .iter()
            .zip(&out)
            .filter(|(_, refused)| refused.is_none())
            .map(|(call, _)| call)
            .collect();
        if sent.is_empty() {
            return out.into_iter().flatten().collect();
        }
        let keys: Vec<&str> = sent.iter().map(|c| c.key.as_str()).collect();
        let shared = Shared::of(&sent);
        let mut args: Vec<&[u8]> = Vec::with_capacity(4 + sent.len() * 8);
        args.extend(shared.head());
        for call in &sent {
            shared.push(call, &mut args);
        }
        let mut replies: Vec<Result<Value, StoreError>> = match self
            .batch
            .run_many(&self.server, &keys, &args)
            .await
            .map_err(store_error)
        {
            Ok(Value::Array(replies)) if replies.len() == sent.len() => {
                replies.into_iter().map(own_reply).collect()
            }
            Ok(other) => {
                let reason = format!(
                    "the batch script answered {} calls with {}",
                    sent.len(),
                    describe(&other)
                );
                let error = StoreError::Backend(reason.into());
                sent.iter().map(|_| Err(error.copy())).collect()
            }
            Err(error) => sent.iter().map(|_| Err(error.copy())).collect(),
        };
        replies.reverse();
        out.into_iter()
            .map(|slot| {
                slot.unwrap_or_else(|| {
                    replies
                        .pop()
                        .unwrap_or_else(|| Err(StoreError::Backend("no reply".into())))
                })
            })
            .collect()
    }

    fn lost(&self) -> Result<Value, StoreError> {
        Err(idem::group::lost())
    }

    fn bytes(&self, call: &Call) -> usize {
        call.bytes()
    }
}

/// A call's own entry of the batch reply: `{'!', message}` is an error the
/// script raised for that call alone.
fn own_reply(reply: Value) -> Result<Value, StoreError> {
    if let Value::Array(items) = &reply {
        if let [Value::BulkString(tag), message] = items.as_slice() {
            if tag == b"!" {
                let message = match message {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => format!("{other:?}"),
                };
                // Classified by its code, the message's first word, as
                // a reply to the call alone would be.
                let code = message.split_whitespace().next().unwrap_or("");
                return Err(if transient_code(code) {
                    StoreError::Unavailable(message.into())
                } else {
                    StoreError::Backend(message.into())
                });
            }
        }
    }
    Ok(reply)
}

fn describe(value: &Value) -> String {
    match value {
        Value::Array(items) => format!("{} entries", items.len()),
        other => format!("{other:?}"),
    }
}
