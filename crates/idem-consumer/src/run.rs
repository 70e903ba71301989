//! The consume loop: deliveries from a [`Broker`], each through the
//! consumer, each disposition carried out by the broker.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use idem::{ClaimedAhead, Codec, Store};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::broker::{Broker, DeadLetter, Deliveries};
use crate::consumer::{Consumer, Decision, Disposition, Job, Stopped};

impl<S, C> Consumer<S, C>
where
    S: Store + Send + Sync + 'static,
    C: Codec + Send + Sync + 'static,
{
    /// Consumes `broker` until `shutdown` resolves: takes deliveries while
    /// fewer than [`Broker::concurrency`] are in flight, runs each through
    /// [`process`](Self::process) in its own task and settles it as
    /// [`Broker`] describes. When `shutdown` resolves it takes no more,
    /// lets those in flight finish and settle, calls [`Broker::stop`] and
    /// returns [`Stopped::Shutdown`]. Deliveries the broker sent but the
    /// loop never took stay unacknowledged, so the broker delivers them
    /// again: nothing is lost on shutdown or on a crash.
    ///
    /// Returns [`Stopped::Ended`] when the delivery stream ends, and the
    /// broker's error when it cannot start or its stream fails; those in
    /// flight are settled first either way. A stream failure the broker
    /// [survives](Broker::resubscribe) does not end the run: it
    /// subscribes again, waiting 100 ms, then twice as long up to 5 s,
    /// between tries (back to 100 ms once a delivery arrives).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::sync::Arc;
    /// use idem::{Idempotency, MemoryStore, Scope};
    /// use idem_consumer::{Consumer, MemoryBroker, OwnedMessage, Stopped};
    ///
    /// let consumer = Consumer::builder(
    ///     Idempotency::builder(MemoryStore::new()).build()?,
    ///     Scope::new("orders")?,
    /// )
    /// .build();
    /// let broker = Arc::new(MemoryBroker::new());
    /// for _ in 0..3 {
    ///     broker.publish(OwnedMessage::new("{}").with_header("Idempotency-Key", "o-1"));
    /// }
    /// broker.close();
    /// let stopped = consumer
    ///     .run(&broker, |_job| async { Ok::<_, std::io::Error>(7) }, std::future::pending())
    ///     .await?;
    /// assert_eq!(stopped, Stopped::Ended);
    /// assert_eq!((consumer.stats().executed, consumer.stats().replayed), (1, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn run<B, T, E, H, Fut>(
        &self,
        broker: &Arc<B>,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Stopped, B::Error>
    where
        B: Broker,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
        H: Fn(Job<B::Message>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let mut deliveries = broker.deliveries().await?;
        let mut wait = RESUBSCRIBE_FIRST;
        let concurrency = broker.concurrency().max(1);
        let handler = Arc::new(handler);
        let mut in_flight = JoinSet::new();
        // What the stream gave after a window's last delivery (an error or
        // its end), handled before the stream is read again.
        let mut held = None;
        tokio::pin!(shutdown);
        let stopped = loop {
            let next = match held.take() {
                Some(next) => next,
                None => tokio::select! {
                    () = &mut shutdown => break Ok(Stopped::Shutdown),
                    Some(_) = in_flight.join_next(), if !in_flight.is_empty() => continue,
                    next = deliveries.next(), if in_flight.len() < concurrency => next,
                },
            };
            match next {
                Some(Ok(message)) => {
                    wait = RESUBSCRIBE_FIRST;
                    let room = concurrency - in_flight.len();
                    let window = waiting(message, &mut deliveries, room, &mut held);
                    self.start(window, broker, &handler, &mut in_flight);
                }
                Some(Err(error)) if broker.resubscribe(&error) => {
                    tracing::warn!(
                        consumer = %self.name(),
                        %error,
                        "the delivery stream failed; subscribing again"
                    );
                    match resubscribe(&**broker, &mut shutdown, &mut wait).await {
                        Some(Ok(next)) => deliveries = next,
                        Some(Err(error)) => break Err(error),
                        None => break Ok(Stopped::Shutdown),
                    }
                }
                Some(Err(error)) => break Err(error),
                None => break Ok(Stopped::Ended),
            }
        };
        while in_flight.join_next().await.is_some() {}
        broker.stop().await;
        stopped
    }

    /// Starts a task per delivery of `window`. When the consumer
    /// [claims ahead](crate::ConsumerBuilder::claim_ahead) and more than
    /// one arrived, a task of their own claims them together and hands
    /// each its claim; meanwhile the loop goes on taking deliveries.
    fn start<B, T, E, H, Fut>(
        &self,
        window: Vec<B::Message>,
        broker: &Arc<B>,
        handler: &Arc<H>,
        in_flight: &mut JoinSet<()>,
    ) where
        B: Broker,
        T: Serialize + DeserializeOwned + Send + 'static,
        E: StdError + Send + Sync + 'static,
        H: Fn(Job<B::Message>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let window: Vec<Arc<B::Message>> = window.into_iter().map(Arc::new).collect();
        let mut claims = (window.len() > 1 && self.claims_ahead()).then(|| {
            let (senders, receivers): (Vec<_>, Vec<oneshot::Receiver<Option<ClaimedAhead>>>) =
                window.iter().map(|_| oneshot::channel()).unzip();
            let (consumer, messages) = (self.clone(), window.clone());
            // Not in `in_flight`: it holds no delivery, and one whose
            // handlers were dropped only leaves claims to run out.
            drop(tokio::spawn(async move {
                let claimed = consumer.claim_window(&messages).await.unwrap_or_default();
                for (sender, claim) in senders.into_iter().zip(claimed) {
                    let _ = sender.send(claim);
                }
            }));
            receivers.into_iter()
        });
        for message in window {
            let claim = claims.as_mut().and_then(Iterator::next);
            let (consumer, handler, broker) =
                (self.clone(), Arc::clone(handler), Arc::clone(broker));
            in_flight.spawn(async move {
                // No claim made ahead (no usable key, or the claiming
                // task ended first): claimed on its own, as without.
                let ahead = match claim {
                    Some(claim) => claim.await.ok().flatten(),
                    None => None,
                };
                let job = |job| handler(job);
                let decision = match ahead {
                    Some(ahead) => {
                        consumer
                            .process_claimed(Arc::clone(&message), ahead, job)
                            .await
                    }
                    None => consumer.process(Arc::clone(&message), job).await,
                };
                consumer.settle(&*broker, &message, decision).await;
            });
        }
    }

    /// Carries out `decision` on `broker`, per the table on [`Broker`].
    /// Each broker call is given [`SETTLE_TIMEOUT`]: a call that does not
    /// answer (an ack queued on a connection that died) must not hold a
    /// place in the window for ever; the broker delivers such a message
    /// again.
    async fn settle<B: Broker>(&self, broker: &B, message: &B::Message, decision: Decision) {
        let settled = match decision.disposition {
            Disposition::Ack(_) => bounded(broker.ack(message)).await,
            Disposition::Retry { after, .. } => self.retry(broker, message, after).await,
            Disposition::DeadLetter { reason } => {
                let letter = DeadLetter {
                    reason: &reason,
                    key: decision.key.as_ref(),
                    consumer: self.name(),
                };
                match bounded(broker.dead_letter(message, &letter)).await {
                    Ok(()) => bounded(broker.end_dead_lettered(message)).await,
                    Err(error) => {
                        tracing::warn!(
                            consumer = %self.name(),
                            %error,
                            "dead-letter copy not stored; the message stays and is retried"
                        );
                        self.retry(broker, message, self.max_retry_delay()).await
                    }
                }
            }
        };
        if let Err(error) = settled {
            tracing::warn!(
                consumer = %self.name(),
                %error,
                "could not settle a delivery; the broker delivers it again"
            );
        }
    }

    async fn retry<B: Broker>(
        &self,
        broker: &B,
        message: &B::Message,
        after: Duration,
    ) -> Result<(), crate::SettleError> {
        let retried = bounded(broker.retry(message, after)).await;
        if retried.is_err() {
            let _ = tokio::time::timeout(SETTLE_TIMEOUT, broker.give_back(message)).await;
        }
        retried
    }
}

/// How long one broker call that settles a delivery may take before it
/// is given up and the delivery left to the broker.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// `call`, or an error once [`SETTLE_TIMEOUT`] passed without an answer.
async fn bounded(
    call: impl Future<Output = Result<(), crate::SettleError>>,
) -> Result<(), crate::SettleError> {
    tokio::time::timeout(SETTLE_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer from the broker within {SETTLE_TIMEOUT:?}; it delivers the message again"
            )
            .into())
        })
}

/// `first` and the deliveries the stream has ready now, up to `room` in
/// all, without waiting for more. An error or the stream's end met on the
/// way is put in `held` for the loop to handle next.
fn waiting<M, E>(
    first: M,
    deliveries: &mut Deliveries<M, E>,
    room: usize,
    held: &mut Option<Option<Result<M, E>>>,
) -> Vec<M> {
    let mut window = vec![first];
    while window.len() < room {
        match deliveries.next().now_or_never() {
            Some(Some(Ok(message))) => window.push(message),
            Some(next) => {
                *held = Some(next);
                break;
            }
            None => break,
        }
    }
    window
}

/// The first wait before subscribing again, doubled after each failure.
const RESUBSCRIBE_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between tries to subscribe again.
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(5);

/// Subscribes again after a failure the broker survives, until it works,
/// fails for good, or `shutdown` resolves (`None`). `wait` is the backoff,
/// kept across failures until a delivery arrives, so a subscription that
/// fails as soon as it is made is not retried ever faster.
async fn resubscribe<B: Broker, F: Future<Output = ()>>(
    broker: &B,
    shutdown: &mut Pin<&mut F>,
    wait: &mut Duration,
) -> Option<Result<Deliveries<B::Message, B::Error>, B::Error>> {
    loop {
        tokio::select! {
            () = shutdown.as_mut() => return None,
            () = tokio::time::sleep(*wait) => {}
        }
        *wait = (*wait * 2).min(RESUBSCRIBE_MAX);
        let subscribed = tokio::select! {
            () = shutdown.as_mut() => return None,
            subscribed = broker.deliveries() => subscribed,
        };
        match subscribed {
            Ok(deliveries) => return Some(Ok(deliveries)),
            Err(error) if broker.resubscribe(&error) => {
                tracing::warn!(%error, wait = ?*wait, "subscribing again failed; trying again");
            }
            Err(error) => return Some(Err(error)),
        }
    }
}
