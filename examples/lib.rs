//! Support for idem's runnable examples: an in-process broker that behaves
//! like a real one where it matters here. It delivers at least once: every
//! message may arrive several times, an unacknowledged delivery comes back
//! after a visibility timeout, and a nack comes back after its delay.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};

/// One delivery of a message.
#[derive(Debug, Clone)]
pub struct Delivery<M> {
    /// The message.
    pub message: M,
    /// How many times this delivery has come back (0 for a first send).
    pub redelivered: u32,
}

/// An in-process at-least-once broker.
pub struct Broker<M> {
    tx: mpsc::UnboundedSender<Delivery<M>>,
    rx: Mutex<mpsc::UnboundedReceiver<Delivery<M>>>,
    outstanding: AtomicUsize,
    visibility: Duration,
}

impl<M: Clone + Send + 'static> Broker<M> {
    /// A broker that redelivers unacknowledged messages after `visibility`.
    pub fn new(visibility: Duration) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            tx,
            rx: Mutex::new(rx),
            outstanding: AtomicUsize::new(0),
            visibility,
        })
    }

    /// Publishes one copy of `message`.
    pub fn publish(&self, message: M) {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        // The receiver lives as long as the broker, so sending cannot fail.
        let _ = self.tx.send(Delivery {
            message,
            redelivered: 0,
        });
    }

    /// The next delivery, or `None` once every delivery has been acked.
    pub async fn next(&self) -> Option<Delivery<M>> {
        loop {
            if self.outstanding.load(Ordering::SeqCst) == 0 {
                return None;
            }
            let mut rx = self.rx.lock().await;
            match tokio::time::timeout(Duration::from_millis(20), rx.recv()).await {
                Ok(Some(delivery)) => return Some(delivery),
                Ok(None) => return None,
                Err(_) => continue,
            }
        }
    }

    /// The delivery was handled: it will not come back.
    pub fn ack(&self, _delivery: Delivery<M>) {
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
    }

    /// Puts the delivery back after `delay`.
    pub fn nack(self: &Arc<Self>, mut delivery: Delivery<M>, delay: Duration) {
        delivery.redelivered += 1;
        let tx = self.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tx.send(delivery);
        });
    }

    /// The consumer died holding the delivery: it comes back after the
    /// visibility timeout, as on SQS or a RabbitMQ channel that closed.
    pub fn abandon(self: &Arc<Self>, delivery: Delivery<M>) {
        self.nack(delivery, self.visibility);
    }
}
