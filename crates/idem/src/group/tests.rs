//! The group commit's own cases: batching, limits, cancellation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::*;

/// Answers each call with its own number; records the size of every
/// batch and holds each batch (not single calls) until released.
#[derive(Default)]
struct Echo {
    singles: AtomicUsize,
    batches: Mutex<Vec<Vec<u32>>>,
    gate: Option<Arc<Notify>>,
}

impl Batch for Arc<Echo> {
    type Call = u32;
    type Reply = Option<u32>;

    async fn one(&self, call: u32) -> Option<u32> {
        self.singles.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        Some(call)
    }

    async fn many(&self, calls: Vec<u32>) -> Vec<Option<u32>> {
        self.batches.lock().push(calls.clone());
        calls.into_iter().map(Some).collect()
    }

    fn lost(&self) -> Option<u32> {
        None
    }

    fn bytes(&self, _call: &u32) -> usize {
        10
    }
}

/// A group with one slot, held by a lone call (0) until the gate is
/// opened, so that later calls queue.
async fn held() -> (
    Arc<Echo>,
    Arc<Notify>,
    Arc<GroupCommit<Arc<Echo>>>,
    tokio::task::JoinHandle<Option<u32>>,
) {
    let gate = Arc::new(Notify::new());
    let echo = Arc::new(Echo {
        gate: Some(Arc::clone(&gate)),
        ..Echo::default()
    });
    let limits = Limits {
        senders: 1,
        ..Limits::default()
    };
    let group = GroupCommit::new(Arc::clone(&echo), limits);
    let first = tokio::spawn({
        let group = Arc::clone(&group);
        async move { group.call(0).await }
    });
    while echo.singles.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    (echo, gate, group, first)
}

#[tokio::test]
async fn a_lone_call_runs_on_its_own() {
    let echo = Arc::new(Echo::default());
    let group = GroupCommit::new(Arc::clone(&echo), Limits::default());
    assert_eq!(group.call(7).await, Some(7));
    assert_eq!(group.call(8).await, Some(8));
    assert_eq!(echo.singles.load(Ordering::SeqCst), 2);
    assert!(echo.batches.lock().is_empty());
    assert_eq!(group.queue.lock().sending, 0, "the slot is given back");
}

/// While every slot is taken by calls on their own, later calls queue
/// and go as one batch, each answered with its own reply.
#[tokio::test]
async fn calls_made_while_the_slots_are_busy_go_together() {
    let (echo, gate, group, first) = held().await;
    let queued: Vec<_> = (1..=5)
        .map(|n| {
            let group = Arc::clone(&group);
            tokio::spawn(async move { group.call(n).await })
        })
        .collect();
    while group.queue.lock().calls.len() < 5 {
        tokio::task::yield_now().await;
    }
    gate.notify_one();
    assert_eq!(first.await.expect("first"), Some(0));
    for (n, call) in (1..=5).zip(queued) {
        assert_eq!(call.await.expect("queued"), Some(n));
    }
    assert_eq!(*echo.batches.lock(), [vec![1, 2, 3, 4, 5]]);
    assert_eq!(group.queue.lock().sending, 0);
}

#[tokio::test]
async fn a_submission_stays_in_order_and_batches_keep_to_the_limits() {
    let echo = Arc::new(Echo::default());
    let limits = Limits {
        calls: 4,
        bytes: 1 << 20,
        senders: 1,
    };
    let group = GroupCommit::new(Arc::clone(&echo), limits);
    let replies = group.call_all((0..10).collect()).await;
    assert_eq!(replies, (0..10).map(Some).collect::<Vec<_>>());
    assert_eq!(
        *echo.batches.lock(),
        [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
    );

    // Bytes: 10 a call, 25 a batch, so two calls go together; a
    // submission is never split, so one of three goes whole.
    let echo = Arc::new(Echo::default());
    let limits = Limits {
        calls: 100,
        bytes: 25,
        senders: 1,
    };
    let group = GroupCommit::new(Arc::clone(&echo), limits);
    let mut queue = group.queue.lock();
    for (call, joined) in [(1, false), (2, false), (3, false), (4, false), (5, true)] {
        let (reply, _receiver) = oneshot::channel();
        queue.calls.push(Queued {
            call,
            reply,
            joined,
        });
    }
    let sizes: Vec<Vec<u32>> = std::iter::from_fn(|| {
        let batch = group.take_batch(&mut queue.calls);
        (!batch.is_empty()).then(|| batch.into_iter().map(|q| q.call).collect())
    })
    .collect();
    assert_eq!(sizes, [vec![1, 2], vec![3], vec![4, 5]]);
}

/// A caller that gives up takes only its own answer: the batch still
/// runs and the others get theirs.
#[tokio::test]
async fn a_caller_that_gives_up_leaves_the_batch_to_the_others() {
    let (echo, gate, group, first) = held().await;
    let quitter = {
        let group = Arc::clone(&group);
        tokio::spawn(async move { group.call(1).await })
    };
    let stayer = {
        let group = Arc::clone(&group);
        tokio::spawn(async move { group.call(2).await })
    };
    while group.queue.lock().calls.len() < 2 {
        tokio::task::yield_now().await;
    }
    quitter.abort();
    gate.notify_one();
    assert_eq!(first.await.expect("first"), Some(0));
    assert_eq!(stayer.await.expect("stayer"), Some(2));
    assert_eq!(*echo.batches.lock(), [vec![1, 2]]);
}

/// A sending task that never runs (spawned on a runtime that shut
/// down) while another slot is held leaves the queue to that slot's
/// holder, which sends it: the call is answered, not lost.
#[test]
fn a_sender_that_never_runs_leaves_the_queue_to_a_live_slot() {
    let live = tokio::runtime::Runtime::new().expect("runtime");
    let dead = tokio::runtime::Runtime::new().expect("runtime");
    let dead_handle = dead.handle().clone();
    drop(dead);
    let gate = Arc::new(Notify::new());
    let echo = Arc::new(Echo {
        gate: Some(Arc::clone(&gate)),
        ..Echo::default()
    });
    let group = GroupCommit::new(Arc::clone(&echo), Limits::default());
    let first = live.spawn({
        let group = Arc::clone(&group);
        async move { group.call(0).await }
    });
    while echo.singles.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    let mut replies = {
        let _entered = dead_handle.enter();
        group.submit(vec![1])
    };
    let reply = replies.pop().expect("one reply");
    gate.notify_one();
    let answered = live.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), group.answer(reply)).await
    });
    assert_eq!(answered, Ok(Some(1)));
    assert_eq!(live.block_on(first).expect("first"), Some(0));
    // The sending task answers its batch before it looks at the queue
    // again and gives its slot back: give it a moment.
    let idle = live.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), async {
            while group.queue.lock().sending != 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
    });
    assert!(idle.is_ok(), "every slot is given back");
}

/// A call queued from a runtime that has shut down (a caller dropped
/// as its runtime goes away) starts a sending task there that never
/// runs: the call is answered `lost` at once instead of waiting for
/// good, and the slot is given back.
#[test]
fn calls_queued_on_a_runtime_that_shut_down_are_lost_not_stuck() {
    let old = tokio::runtime::Runtime::new().expect("runtime");
    let handle = old.handle().clone();
    drop(old);
    let group = GroupCommit::new(Arc::new(Echo::default()), Limits::default());
    let mut replies = {
        let _entered = handle.enter();
        group.submit(vec![1])
    };
    let reply = replies.pop().expect("one reply");
    let fresh = tokio::runtime::Runtime::new().expect("runtime");
    let answered = fresh.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), group.answer(reply)).await
    });
    assert_eq!(answered, Ok(None));
    assert_eq!(group.queue.lock().sending, 0, "the slot is given back");
}
