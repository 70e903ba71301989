//! Group commit: calls that callers make at the same time go to a store
//! together, as one batch, instead of one round trip each.
//!
//! A store with a batch form of a primitive ([`ClaimMany`](crate::ClaimMany),
//! [`CompleteMany`](crate::CompleteMany), a batch script) describes it as a
//! [`Batch`] and sends its calls through a [`GroupCommit`]:
//!
//! - a call that finds nothing queued and a sending slot free runs at once,
//!   on its own ([`Batch::one`]), from the caller's task, so a lone caller
//!   waits for nothing and pays no hop;
//! - calls made while [`Limits::senders`] calls or batches are out wait in
//!   a queue and go together as the next batch ([`Batch::many`]). Under
//!   load a batch carries whatever arrived during a round trip, so the
//!   store pays one round trip (one statement, one script run, one WAL
//!   flush) for many calls.
//!
//! Each call is still answered on its own, with its own reply. Calls
//! submitted together ([`GroupCommit::call_all`]) go in one batch, in
//! their order. Batches are sent by a task of their own, so a caller that
//! gives up (its future dropped) takes nothing with it but its own answer;
//! a sending task that never runs (its runtime shut down) answers the
//! calls queued for it with [`Batch::lost`] instead of leaving them
//! waiting for good. A sending task runs on the runtime of the caller
//! that started it: a group shared between runtimes must not be called
//! from one that stops being driven while it is still alive (a
//! current-thread runtime between two `block_on`s), or the calls queued
//! behind its task wait until it is driven again.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use idem::group::{Batch, GroupCommit, Limits};
//!
//! /// Doubles numbers; a real batch would be one statement for all.
//! struct Double;
//!
//! impl Batch for Double {
//!     type Call = u32;
//!     type Reply = Option<u32>;
//!     async fn one(&self, call: u32) -> Option<u32> {
//!         Some(call * 2)
//!     }
//!     async fn many(&self, calls: Vec<u32>) -> Vec<Option<u32>> {
//!         calls.into_iter().map(|c| Some(c * 2)).collect()
//!     }
//!     fn lost(&self) -> Option<u32> {
//!         None
//!     }
//! }
//!
//! let group = GroupCommit::new(Double, Limits::default());
//! assert_eq!(group.call(21).await, Some(42));
//! assert_eq!(group.call_all(vec![1, 2, 3]).await, [Some(2), Some(4), Some(6)]);
//! # });
//! ```

mod pairs;

pub use pairs::{
    claim_through, claims_or_each, complete_through, completions_or_each, key_order, Direct, Pairs,
};

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// A store's batch form of one primitive (or of several, as one script).
pub trait Batch: Send + Sync + 'static {
    /// One call: what the primitive takes.
    type Call: Send + 'static;
    /// One call's answer.
    type Reply: Send + 'static;

    /// Runs `call` on its own: the path of a lone caller.
    fn one(&self, call: Self::Call) -> impl Future<Output = Self::Reply> + Send;

    /// Runs `calls` together, in their order: one reply per call, in
    /// order. A call missing from the replies is answered [`lost`](Self::lost).
    fn many(&self, calls: Vec<Self::Call>) -> impl Future<Output = Vec<Self::Reply>> + Send;

    /// The reply of a call whose batch will never be sent or answered (its
    /// sending task ended first): whether it ran is unknown.
    fn lost(&self) -> Self::Reply;

    /// What `call` weighs against [`Limits::bytes`] (default: nothing).
    fn bytes(&self, call: &Self::Call) -> usize {
        let _ = call;
        0
    }
}

/// The answer of a store call whose batch will never be sent or answered
/// (see [`Batch::lost`]): whether it ran is unknown, as when a store does
/// not answer.
pub fn lost() -> crate::StoreError {
    crate::StoreError::Unavailable(
        "the task sending this call's batch ended before an answer".into(),
    )
}

/// How big batches get and how many go at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most calls one batch carries (at least one).
    pub calls: usize,
    /// The most bytes ([`Batch::bytes`]) one batch carries; a batch takes
    /// at least one submission, however large.
    pub bytes: usize,
    /// How many calls or batches may be out at once (at least one). With
    /// one, calls made while a batch is out wait for its whole round trip;
    /// with two, the next batch goes while the store still works on the
    /// first.
    pub senders: usize,
}

impl Default for Limits {
    /// 128 calls, 1 MiB, two senders: measured on two cores with 64
    /// callers on Redis, one sender gave 27,000–35,000 claim+complete
    /// pairs per second, two 40,000–43,000 with less client CPU per pair,
    /// more no better.
    fn default() -> Self {
        Self {
            calls: 128,
            bytes: 1 << 20,
            senders: 2,
        }
    }
}

/// Sends the calls of one [`Batch`] together when they are made together
/// (see the [module docs](self)).
pub struct GroupCommit<B: Batch> {
    batch: B,
    limits: Limits,
    queue: Mutex<Queue<B>>,
}

struct Queued<B: Batch> {
    call: B::Call,
    reply: oneshot::Sender<B::Reply>,
    /// Whether this call was submitted together with the one before it:
    /// a submission goes in one batch, so its calls run in their order
    /// even with two batches out at once.
    joined: bool,
}

struct Queue<B: Batch> {
    calls: Vec<Queued<B>>,
    /// How many calls run on their own or tasks send batches now.
    sending: usize,
}

impl<B: Batch> std::fmt::Debug for GroupCommit<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queue = self.queue.lock();
        f.debug_struct("GroupCommit")
            .field("limits", &self.limits)
            .field("queued", &queue.calls.len())
            .field("sending", &queue.sending)
            .finish_non_exhaustive()
    }
}

impl<B: Batch> GroupCommit<B> {
    /// Group commit for `batch` within `limits`.
    pub fn new(batch: B, limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            batch,
            limits: Limits {
                calls: limits.calls.max(1),
                bytes: limits.bytes,
                senders: limits.senders.max(1),
            },
            queue: Mutex::new(Queue {
                calls: Vec::new(),
                sending: 0,
            }),
        })
    }

    /// The batch this group sends through.
    pub fn get_ref(&self) -> &B {
        &self.batch
    }

    /// Runs `call`: at once and on its own when nothing is queued and a
    /// slot is free (holding the slot while it is out), otherwise in the
    /// next batch.
    pub async fn call(self: &Arc<Self>, call: B::Call) -> B::Reply {
        let direct = {
            let mut queue = self.queue.lock();
            let free = queue.calls.is_empty() && queue.sending < self.limits.senders;
            if free {
                queue.sending += 1;
            }
            free
        };
        if direct {
            let _slot = Slot { group: self };
            return self.batch.one(call).await;
        }
        let mut replies = self.submit(vec![call]);
        match replies.pop() {
            Some(reply) => self.answer(reply).await,
            None => self.batch.lost(),
        }
    }

    /// Runs `calls` in order and returns their replies in order: in one
    /// batch, or, beyond [`Limits::calls`], in batches one after another.
    pub async fn call_all(self: &Arc<Self>, calls: Vec<B::Call>) -> Vec<B::Reply> {
        let mut out = Vec::with_capacity(calls.len());
        let mut calls = calls.into_iter().peekable();
        while calls.peek().is_some() {
            let chunk: Vec<B::Call> = calls.by_ref().take(self.limits.calls).collect();
            for reply in self.submit(chunk) {
                out.push(self.answer(reply).await);
            }
        }
        out
    }

    async fn answer(&self, reply: oneshot::Receiver<B::Reply>) -> B::Reply {
        match reply.await {
            Ok(reply) => reply,
            Err(_) => self.batch.lost(),
        }
    }

    /// Queues `calls` as one submission and makes sure a task is sending.
    fn submit(self: &Arc<Self>, calls: Vec<B::Call>) -> Vec<oneshot::Receiver<B::Reply>> {
        let mut receivers = Vec::with_capacity(calls.len());
        let start = {
            let mut queue = self.queue.lock();
            for (i, call) in calls.into_iter().enumerate() {
                let (reply, receiver) = oneshot::channel();
                receivers.push(receiver);
                queue.calls.push(Queued {
                    call,
                    reply,
                    joined: i > 0,
                });
            }
            let start = !queue.calls.is_empty() && queue.sending < self.limits.senders;
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
            group: Arc::clone(self),
            done: false,
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn(sending.send_all()));
        }
    }

    /// Gives back a sending slot that will send nothing more. When no
    /// other slot is taken (whose holder would send them), the calls
    /// queued are dropped (outside the lock), so their callers get
    /// [`Batch::lost`].
    fn give_up_sending(&self) {
        let stranded = {
            let mut queue = self.queue.lock();
            queue.sending -= 1;
            if queue.sending == 0 {
                std::mem::take(&mut queue.calls)
            } else {
                Vec::new()
            }
        };
        drop(stranded);
    }

    /// One batch: its calls together, the replies handed out in order.
    async fn send(&self, batch: Vec<Queued<B>>) {
        let (calls, senders): (Vec<B::Call>, Vec<oneshot::Sender<B::Reply>>) =
            batch.into_iter().map(|q| (q.call, q.reply)).unzip();
        let mut replies = self.batch.many(calls).await.into_iter();
        for sender in senders {
            let reply = replies.next().unwrap_or_else(|| self.batch.lost());
            let _ = sender.send(reply);
        }
    }

    /// The front of the queue, up to the limits, in whole submissions (at
    /// least one, however large).
    fn take_batch(&self, calls: &mut Vec<Queued<B>>) -> Vec<Queued<B>> {
        let (mut n, mut bytes) = (0, 0);
        while n < calls.len() {
            let end = n + 1 + calls[n + 1..].iter().take_while(|q| q.joined).count();
            let size: usize = calls[n..end]
                .iter()
                .map(|q| self.batch.bytes(&q.call))
                .sum();
            if n > 0 && (end > self.limits.calls || bytes + size > self.limits.bytes) {
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
}

/// A slot held by a call running on its own. Giving it back starts a
/// sending task if calls queued up meanwhile, whether the call finished
/// or its caller gave up.
struct Slot<'a, B: Batch> {
    group: &'a Arc<GroupCommit<B>>,
}

impl<B: Batch> Drop for Slot<'_, B> {
    fn drop(&mut self) {
        let start = {
            let mut queue = self.group.queue.lock();
            let start = !queue.calls.is_empty();
            if !start {
                queue.sending -= 1;
            }
            start
        };
        // The slot passes to a sending task, which takes what queued up.
        if start {
            self.group.start_sending();
        }
    }
}

/// A sending slot: marks the group idle when its sending task ends for
/// any reason. A task that ends early, or never runs (its runtime shut
/// down), fails whatever is still queued instead of leaving it waiting for
/// good.
struct Sending<B: Batch> {
    group: Arc<GroupCommit<B>>,
    done: bool,
}

impl<B: Batch> Sending<B> {
    /// Sends what is queued, a batch at a time, until the queue is empty
    /// (one of at most [`Limits::senders`] tasks doing so).
    async fn send_all(mut self) {
        loop {
            let batch = {
                let mut queue = self.group.queue.lock();
                if queue.calls.is_empty() {
                    queue.sending -= 1;
                    self.done = true;
                    return;
                }
                self.group.take_batch(&mut queue.calls)
            };
            self.group.send(batch).await;
        }
    }
}

impl<B: Batch> Drop for Sending<B> {
    fn drop(&mut self) {
        if !self.done {
            self.group.give_up_sending();
        }
    }
}

#[cfg(test)]
mod tests;
