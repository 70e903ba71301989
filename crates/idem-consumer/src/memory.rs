//! An in-process broker that delivers at least once, for examples, doc
//! tests and tests of the consume loop.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::stream;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::broker::{Broker, DeadLetter, Deliveries, SettleError};
use crate::{Message, OwnedMessage};

/// The visibility timeout unless configured.
pub const DEFAULT_VISIBILITY: Duration = Duration::from_secs(30);
/// How long an idle subscription sleeps between looks at a closed broker.
const IDLE_CHECK: Duration = Duration::from_millis(20);

/// An in-process broker with the delivery guarantees of a real one where
/// they matter to idem (SQS-like):
///
/// - every delivery is out until it is acked, retried or dead-lettered;
///   one left unsettled past the visibility timeout (a worker that died)
///   is delivered again, and [`Message::keep_alive`] pushes that back;
/// - a retry comes back after its delay, with the delivery count raised;
/// - settling a delivery that already came back again is refused, as a
///   stale receipt is;
/// - dead-letter copies are kept, with their headers, for
///   [`dead_letters`](Self::dead_letters).
///
/// [`close`](Self::close) says nothing more will be published: the
/// subscription then ends once every message is acked or dead-lettered.
/// Several consumers may subscribe at once; they share the deliveries.
#[derive(Debug, Clone)]
pub struct MemoryBroker {
    state: Arc<State>,
    concurrency: usize,
}

#[derive(Debug)]
struct State {
    queues: Mutex<Queues>,
    arrived: Notify,
    closed: AtomicBool,
    fail_dead_letters: AtomicBool,
    receipts: AtomicU64,
    visibility: Duration,
}

#[derive(Debug, Default)]
struct Queues {
    /// Messages waiting, each with the time it may be delivered.
    ready: VecDeque<(Instant, OwnedMessage)>,
    /// Deliveries out, by receipt: the message and when it comes back.
    out: HashMap<u64, (Instant, OwnedMessage)>,
    acked: u64,
    deliveries: u64,
    dead: Vec<OwnedMessage>,
}

/// One delivery from a [`MemoryBroker`].
#[derive(Debug)]
pub struct MemoryMessage {
    message: OwnedMessage,
    receipt: u64,
    state: Arc<State>,
}

impl MemoryMessage {
    /// The message as published, with its delivery count.
    pub fn message(&self) -> &OwnedMessage {
        &self.message
    }
}

impl Message for MemoryMessage {
    fn payload(&self) -> &[u8] {
        self.message.payload()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.message.header(name)
    }

    fn message_id(&self) -> Option<&str> {
        self.message.message_id()
    }

    fn message_id_per_send(&self) -> Option<&'static str> {
        self.message.message_id_per_send()
    }

    fn delivery_count(&self) -> Option<u32> {
        self.message.delivery_count()
    }

    fn last_delivery(&self) -> Option<u32> {
        self.message.last_delivery()
    }

    async fn keep_alive(&self) {
        let mut queues = self.state.lock();
        if let Some((back, _)) = queues.out.get_mut(&self.receipt) {
            *back = later(self.state.visibility);
        }
    }
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBroker {
    /// An empty broker: visibility timeout 30 s, 16 deliveries in flight
    /// per subscriber.
    pub fn new() -> Self {
        Self {
            state: Arc::new(State {
                queues: Mutex::new(Queues::default()),
                arrived: Notify::new(),
                closed: AtomicBool::new(false),
                fail_dead_letters: AtomicBool::new(false),
                receipts: AtomicU64::new(0),
                visibility: DEFAULT_VISIBILITY,
            }),
            concurrency: 16,
        }
    }

    /// How long a delivery may stay unsettled before it is delivered
    /// again (default 30 s). Set before publishing.
    #[must_use]
    pub fn visibility(mut self, visibility: Duration) -> Self {
        if let Some(state) = Arc::get_mut(&mut self.state) {
            state.visibility = visibility;
        }
        self
    }

    /// Deliveries processed at once by a consumer of this handle (default
    /// 16).
    #[must_use]
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Publishes one copy of `message`.
    pub fn publish(&self, message: OwnedMessage) {
        let mut queues = self.state.lock();
        queues
            .ready
            .push_back((Instant::now(), message.with_delivery_count(1)));
        drop(queues);
        self.state.arrived.notify_waiters();
    }

    /// Nothing more will be published: subscriptions end once every
    /// message is acked or dead-lettered.
    pub fn close(&self) {
        self.state.closed.store(true, Ordering::SeqCst);
        self.state.arrived.notify_waiters();
    }

    /// Makes dead-letter copies fail (as a dead-letter destination that
    /// is missing or away would), or work again.
    pub fn fail_dead_letters(&self, fail: bool) {
        self.state.fail_dead_letters.store(fail, Ordering::SeqCst);
    }

    /// Messages acknowledged.
    pub fn acked(&self) -> u64 {
        self.state.lock().acked
    }

    /// Deliveries made, redeliveries included.
    pub fn deliveries_made(&self) -> u64 {
        self.state.lock().deliveries
    }

    /// Messages not yet acked or dead-lettered (waiting or out).
    pub fn unsettled(&self) -> usize {
        let queues = self.state.lock();
        queues.ready.len() + queues.out.len()
    }

    /// The dead-letter copies, with the headers the consumer added.
    pub fn dead_letters(&self) -> Vec<OwnedMessage> {
        self.state.lock().dead.clone()
    }

    /// The next delivery, or `None` once the broker is closed and every
    /// message is settled.
    pub async fn next(&self) -> Option<MemoryMessage> {
        loop {
            let arrived = self.state.arrived.notified();
            let wake = {
                let mut queues = self.state.lock();
                let now = Instant::now();
                queues.requeue_expired(now);
                if let Some(at) = queues.ready.iter().position(|(due, _)| *due <= now) {
                    let (_, message) = queues.ready.remove(at).expect("position is in range");
                    let receipt = self.state.receipts.fetch_add(1, Ordering::Relaxed);
                    queues.deliveries += 1;
                    queues
                        .out
                        .insert(receipt, (later(self.state.visibility), message.clone()));
                    return Some(MemoryMessage {
                        message,
                        receipt,
                        state: Arc::clone(&self.state),
                    });
                }
                if self.state.closed.load(Ordering::SeqCst)
                    && queues.ready.is_empty()
                    && queues.out.is_empty()
                {
                    return None;
                }
                queues
                    .next_due()
                    .map_or(now + IDLE_CHECK, |due| due.min(now + IDLE_CHECK))
            };
            tokio::select! {
                () = arrived => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Ends delivery `message` with `f` on its entry, or refuses a stale
    /// one.
    fn settle(
        &self,
        message: &MemoryMessage,
        f: impl FnOnce(&mut Queues, OwnedMessage),
    ) -> Result<(), SettleError> {
        let mut queues = self.state.lock();
        let Some((_, original)) = queues.out.remove(&message.receipt) else {
            return Err("the delivery's visibility timeout ran out: it was delivered again".into());
        };
        f(&mut queues, original);
        drop(queues);
        self.state.arrived.notify_waiters();
        Ok(())
    }
}

impl State {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Queues {
    /// Deliveries out past their visibility go back, counted once more.
    fn requeue_expired(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .out
            .iter()
            .filter(|(_, (back, _))| *back <= now)
            .map(|(receipt, _)| *receipt)
            .collect();
        for receipt in expired {
            if let Some((_, message)) = self.out.remove(&receipt) {
                self.ready.push_back((now, redelivery(message)));
            }
        }
    }

    fn next_due(&self) -> Option<Instant> {
        self.ready
            .iter()
            .map(|(due, _)| *due)
            .chain(self.out.values().map(|(back, _)| *back))
            .min()
    }
}

/// `after` from now; a delay too long for the clock is a day (a retry
/// delay can be as long as a caller asks).
fn later(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(24 * 3600))
}

fn redelivery(message: OwnedMessage) -> OwnedMessage {
    let count = message.delivery_count().unwrap_or(1);
    message.with_delivery_count(count.saturating_add(1))
}

impl Broker for MemoryBroker {
    type Message = MemoryMessage;
    type Error = Infallible;

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    async fn deliveries(&self) -> Result<Deliveries<MemoryMessage, Infallible>, Infallible> {
        let broker = self.clone();
        Ok(Box::pin(stream::unfold(broker, |broker| async move {
            let next = broker.next().await?;
            Some((Ok(next), broker))
        })))
    }

    async fn ack(&self, message: &MemoryMessage) -> Result<(), SettleError> {
        self.settle(message, |queues, _| queues.acked += 1)
    }

    async fn retry(&self, message: &MemoryMessage, after: Duration) -> Result<(), SettleError> {
        self.settle(message, |queues, original| {
            queues.ready.push_back((later(after), redelivery(original)));
        })
    }

    async fn dead_letter(
        &self,
        message: &MemoryMessage,
        letter: &DeadLetter<'_>,
    ) -> Result<(), SettleError> {
        if self.state.fail_dead_letters.load(Ordering::SeqCst) {
            return Err("the dead-letter destination refused the copy".into());
        }
        let copy = letter
            .headers()
            .iter()
            .fold(message.message.clone(), |copy, (name, value)| {
                copy.with_header(name, value)
            });
        self.state.lock().dead.push(copy);
        Ok(())
    }

    async fn end_dead_lettered(&self, message: &MemoryMessage) -> Result<(), SettleError> {
        self.settle(message, |_, _| {})
    }
}
