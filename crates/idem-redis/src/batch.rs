//! Group commit on one server: the primitives that callers make at the
//! same time go to Redis together, as one call of the batch script
//! (`lua/batch.lua`), instead of one script call each.
//!
//! A call that finds nothing queued and a slot free runs at once, on its
//! own, from the caller's task, so a lone caller waits for nothing and
//! pays no hop; calls made while [`SENDERS`] calls or batches are out wait
//! in a queue and go together as the next batch.
//! Under load a batch carries whatever arrived during a round trip, so the
//! server runs one script and the client makes one request for many
//! calls, where a busy consumer used to pay two script calls a message.
//!
//! Each call is still atomic on its own. Calls submitted together (the
//! claims of one `claim_many`) go in one batch and run in their order;
//! calls of different callers are concurrent, as they are without
//! batching. A call that raises an error in the script fails alone; the
//! rest of its batch runs. A batch that gets no answer fails every call in
//! it with the same error, as each single call would have failed.
//!
//! Batches are sent by a task of their own, so a caller that gives up
//! (its future dropped) takes nothing with it but its own answer.

use std::sync::Arc;

use bytes::Bytes;
use idem::StoreError;
use parking_lot::Mutex;
use redis::Value;
use tokio::sync::oneshot;

use crate::conn::{store_error, Server};
use crate::copy_error;
use crate::scripts::Script;

/// The most calls one batch carries.
const MAX_CALLS: usize = 128;
/// How many calls or batches may be out at once. With one, calls made
/// while a batch is out wait for its whole round trip; with two, the next
/// batch goes while the server still runs the first. Measured on two cores with
/// 64 callers: one gave 27,000–35,000 claim+complete pairs per second,
/// two 40,000–43,000 with less client CPU per pair, more no better.
const SENDERS: usize = 2;
/// The most argument bytes one batch carries (a batch takes at least one
/// call, however large).
const MAX_BYTES: usize = 1 << 20;

/// A primitive the batch script runs: its code there and how many
/// arguments follow the code (see `lua/batch.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Claim,
    Complete,
    Fail,
    Extend,
    Release,
}

impl Op {
    /// Every primitive, in the order the batch script defines them.
    pub(crate) const ALL: [Op; 5] = [Op::Claim, Op::Complete, Op::Fail, Op::Extend, Op::Release];

    fn code(self) -> &'static [u8] {
        match self {
            Op::Claim => b"c",
            Op::Complete => b"d",
            Op::Fail => b"f",
            Op::Extend => b"x",
            Op::Release => b"r",
        }
    }

    fn arity(self) -> usize {
        match self {
            Op::Claim => 7,
            Op::Complete => 4,
            Op::Fail => 5,
            Op::Extend => 3,
            Op::Release => 1,
        }
    }
}

/// One call of a primitive on one record.
pub(crate) struct Call {
    pub(crate) op: Op,
    pub(crate) key: String,
    pub(crate) args: Vec<Bytes>,
}

impl Call {
    fn bytes(&self) -> usize {
        self.key.len() + self.args.iter().map(Bytes::len).sum::<usize>()
    }

    /// The arguments as a script call takes them.
    pub(crate) fn arg_slices(&self) -> Vec<&[u8]> {
        self.args.iter().map(Bytes::as_ref).collect()
    }
}

struct Queued {
    call: Call,
    reply: oneshot::Sender<Result<Value, StoreError>>,
    /// Whether this call was submitted together with the one before it:
    /// a submission goes in one batch, so its calls run in their order
    /// even with two batches out at once.
    joined: bool,
}

#[derive(Default)]
struct Queue {
    calls: Vec<Queued>,
    /// How many tasks are sending batches (each takes what is queued).
    sending: usize,
}

/// The batcher of one server.
pub(crate) struct Batcher {
    server: Server,
    script: Script,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    pub(crate) fn new(server: Server, script: Script) -> Arc<Self> {
        Arc::new(Self {
            server,
            script,
            queue: Mutex::new(Queue::default()),
        })
    }

    /// The batch script, for loading it ahead.
    pub(crate) fn script(&self) -> &Script {
        &self.script
    }

    /// Runs `call` and returns its script's reply. A call that finds the
    /// queue empty and a batch slot free runs at once from the caller's
    /// own task as `single` (its primitive's script), holding the slot
    /// while it is out: a lone caller pays nothing for batching. Otherwise
    /// it waits in the queue for the next batch.
    pub(crate) async fn call(
        self: &Arc<Self>,
        call: Call,
        single: &Script,
    ) -> Result<Value, StoreError> {
        let direct = {
            let mut queue = self.queue.lock();
            let free = queue.calls.is_empty() && queue.sending < SENDERS;
            if free {
                queue.sending += 1;
            }
            free
        };
        if direct {
            let _slot = Slot { batcher: self };
            return single
                .run_on(&self.server, &call.key, &call.arg_slices())
                .await
                .map_err(store_error);
        }
        let mut replies = self.submit(vec![call]);
        match replies.pop() {
            Some(reply) => answer(reply).await,
            None => Err(dropped()),
        }
    }

    /// Runs `calls` in order and returns their replies in order: in one
    /// batch, or, beyond a batch's size, in batches one after another.
    pub(crate) async fn call_all(
        self: &Arc<Self>,
        calls: Vec<Call>,
    ) -> Vec<Result<Value, StoreError>> {
        let mut out = Vec::with_capacity(calls.len());
        let mut calls = calls.into_iter().peekable();
        while calls.peek().is_some() {
            let chunk: Vec<Call> = calls.by_ref().take(MAX_CALLS).collect();
            for reply in self.submit(chunk) {
                out.push(answer(reply).await);
            }
        }
        out
    }

    /// Queues `calls` as one submission and makes sure a task is sending.
    fn submit(
        self: &Arc<Self>,
        calls: Vec<Call>,
    ) -> Vec<oneshot::Receiver<Result<Value, StoreError>>> {
        let mut receivers = Vec::with_capacity(calls.len());
        let start = {
            let mut queue = self.queue.lock();
            let mut joined = false;
            for call in calls {
                let (reply, receiver) = oneshot::channel();
                receivers.push(receiver);
                // The script reads each call's arguments by its arity: a
                // call with another number would shift every later call's.
                if call.args.len() != call.op.arity() {
                    let reason = format!(
                        "{:?} takes {} arguments, not {}",
                        call.op,
                        call.op.arity(),
                        call.args.len()
                    );
                    let _ = reply.send(Err(StoreError::Backend(reason.into())));
                    continue;
                }
                queue.calls.push(Queued {
                    call,
                    reply,
                    joined,
                });
                joined = true;
            }
            let start = !queue.calls.is_empty() && queue.sending < SENDERS;
            if start {
                queue.sending += 1;
            }
            start
        };
        if start {
            self.start_sending();
        }
        receivers
    }

    /// Starts a sending task, which holds a slot already counted in
    /// `sending`. The slot is owned by the task's future from the start, so
    /// a task that never runs (spawned on a runtime that is shutting down,
    /// which drops it) gives the slot back and fails the queued calls, as
    /// does a call made outside any runtime: they never wait for good.
    fn start_sending(self: &Arc<Self>) {
        let sending = Sending {
            batcher: Arc::clone(self),
            done: false,
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(sending.send_all()));
        }
    }

    /// Gives back a sending slot that will send nothing more, failing the
    /// calls queued for it (their callers get [`dropped`]). The calls are
    /// dropped outside the lock.
    fn give_up_sending(&self) {
        let stranded = {
            let mut queue = self.queue.lock();
            queue.sending -= 1;
            std::mem::take(&mut queue.calls)
        };
        drop(stranded);
    }

    /// One batch: one script call, its replies handed out in order.
    async fn send(&self, batch: Vec<Queued>) {
        let keys: Vec<&str> = batch.iter().map(|q| q.call.key.as_str()).collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(batch.len() * 8);
        for queued in &batch {
            args.push(queued.call.op.code());
            args.extend(queued.call.arg_slices());
        }
        let reply = self
            .script
            .run_many(&self.server, &keys, &args)
            .await
            .map_err(store_error);
        match reply {
            Ok(Value::Array(replies)) if replies.len() == batch.len() => {
                for (queued, reply) in batch.into_iter().zip(replies) {
                    let _ = queued.reply.send(own_reply(reply));
                }
            }
            Ok(other) => {
                let reason = format!(
                    "the batch script answered {} calls with {}",
                    batch.len(),
                    describe(&other)
                );
                for queued in batch {
                    let _ = queued
                        .reply
                        .send(Err(StoreError::Backend(reason.clone().into())));
                }
            }
            Err(error) => {
                for queued in batch {
                    let _ = queued.reply.send(Err(copy_error(&error)));
                }
            }
        }
    }
}

/// The front of the queue, up to the batch limits, in whole submissions
/// (at least one, however large).
fn take_batch(calls: &mut Vec<Queued>) -> Vec<Queued> {
    let (mut n, mut bytes) = (0, 0);
    while n < calls.len() {
        let end = n + 1 + calls[n + 1..].iter().take_while(|q| q.joined).count();
        let size: usize = calls[n..end].iter().map(|q| q.call.bytes()).sum();
        if n > 0 && (end > MAX_CALLS || bytes + size > MAX_BYTES) {
            break;
        }
        n = end;
        bytes += size;
    }
    if n == calls.len() {
        std::mem::take(calls)
    } else {
        let rest = calls.split_off(n);
        std::mem::replace(calls, rest)
    }
}

/// A batch slot held by a call running on its own. Giving it back starts
/// a sending task if calls queued up meanwhile, whether the call finished
/// or its caller gave up.
struct Slot<'a> {
    batcher: &'a Arc<Batcher>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let start = {
            let mut queue = self.batcher.queue.lock();
            let start = !queue.calls.is_empty();
            if !start {
                queue.sending -= 1;
            }
            start
        };
        // The slot passes to a sending task, which takes what queued up.
        if start {
            self.batcher.start_sending();
        }
    }
}

/// A sending slot: marks the batcher idle when its sending task ends for
/// any reason. A task that ends early, or never runs (its runtime shut
/// down), fails whatever is still queued instead of leaving it waiting for
/// good.
struct Sending {
    batcher: Arc<Batcher>,
    done: bool,
}

impl Sending {
    /// Sends what is queued, a batch at a time, until the queue is empty
    /// (one of at most [`SENDERS`] tasks doing so).
    async fn send_all(mut self) {
        loop {
            let batch = {
                let mut queue = self.batcher.queue.lock();
                if queue.calls.is_empty() {
                    queue.sending -= 1;
                    self.done = true;
                    return;
                }
                take_batch(&mut queue.calls)
            };
            self.batcher.send(batch).await;
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.done {
            self.batcher.give_up_sending();
        }
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
                return Err(StoreError::Backend(message.into()));
            }
        }
    }
    Ok(reply)
}

async fn answer(
    receiver: oneshot::Receiver<Result<Value, StoreError>>,
) -> Result<Value, StoreError> {
    receiver.await.unwrap_or_else(|_| Err(dropped()))
}

fn dropped() -> StoreError {
    StoreError::Unavailable("the task sending this call's batch ended before an answer".into())
}

fn describe(value: &Value) -> String {
    match value {
        Value::Array(items) => format!("{} entries", items.len()),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::conn::Options;

    /// A call queued from a runtime that has shut down (a caller dropped
    /// as its runtime goes away) starts a sending task there that never
    /// runs: the call fails at once instead of waiting for good.
    #[test]
    fn calls_queued_on_a_runtime_that_shut_down_fail_instead_of_waiting() {
        let redis = idem_testkit::redis::RedisServer::start().expect("redis-server");
        let options = Options {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(2),
            tls_roots: None,
            replica_acks: None,
        };
        let old = tokio::runtime::Runtime::new().expect("runtime");
        let server = old
            .block_on(Server::connect(&redis.url(), &options))
            .expect("connect");
        let handle = old.handle().clone();
        drop(old);
        let batcher = Batcher::new(server, crate::scripts::batch());
        let call = Call {
            op: Op::Release,
            key: "{k}".to_owned(),
            args: vec![Bytes::from_static(b"00")],
        };
        let mut replies = {
            let _entered = handle.enter();
            batcher.submit(vec![call])
        };
        let reply = replies.pop().expect("one reply");
        let fresh = tokio::runtime::Runtime::new().expect("runtime");
        let answered = fresh
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), answer(reply)).await });
        assert!(
            matches!(answered, Ok(Err(StoreError::Unavailable(_)))),
            "{answered:?}"
        );
        assert_eq!(batcher.queue.lock().sending, 0, "the slot is given back");
    }
}
