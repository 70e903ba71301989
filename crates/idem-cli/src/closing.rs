//! The graceful stop of the accept loop's connections: when it comes, each
//! connection is asked to finish the request in hand and close, and the
//! loop waits until every connection task has ended.
//!
//! hyper-util's `GracefulShutdown` polls a `watch` channel's change at
//! every poll of every connection, which takes a lock each time (2 % of
//! the hop's instructions, BENCHMARKS.md); here a connection keeps its
//! waker where the stop can find it, without a lock, and reads a flag.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use hyper_util::server::graceful::GracefulConnection;
use tokio_util::task::TaskTracker;

/// The connection tasks of one accept loop, and their stop.
#[derive(Debug, Default)]
pub(crate) struct Closing {
    shared: Arc<Shared>,
    tasks: TaskTracker,
}

#[derive(Debug, Default)]
struct Shared {
    /// The stop has come.
    closing: AtomicBool,
    next_id: AtomicU64,
    /// Each watched connection's task's waker, by the connection's id.
    wakers: Mutex<HashMap<u64, Arc<AtomicWaker>>>,
}

impl Closing {
    /// Runs `task` (one connection's: its handshake, then the connection
    /// given to [`Watcher::watch`]) as a task the stop waits for.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// What a connection task watches its connection with.
    pub(crate) fn watcher(&self) -> Watcher {
        Watcher {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Asks every connection to finish the request in hand and close, and
    /// waits until all connection tasks have ended.
    pub(crate) async fn close(self) {
        self.stop();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Sets the flag, then wakes every watched connection to read it.
    fn stop(&self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        let wakers: Vec<_> = self
            .shared
            .wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for waker in wakers {
            waker.wake();
        }
    }
}

/// An accept loop dropped before its stop (its task aborted, a `select!`
/// that chose another branch) stops its connections too, as hyper-util's
/// `GracefulShutdown` did when dropped.
impl Drop for Closing {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Watches one connection for the stop.
#[derive(Debug)]
pub(crate) struct Watcher {
    shared: Arc<Shared>,
}

impl Watcher {
    /// `connection`, shut down gracefully once the stop comes (at once if
    /// it has come already).
    pub(crate) fn watch<C: GracefulConnection>(self, connection: C) -> Watched<C> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let waker = Arc::new(AtomicWaker::new());
        self.shared
            .wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::clone(&waker));
        Watched {
            connection,
            asked: false,
            waker,
            _registered: Registered {
                shared: self.shared,
                id,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection that shuts down gracefully when the stop comes.
    pub(crate) struct Watched<C> {
        #[pin]
        connection: C,
        // The connection has been asked to shut down.
        asked: bool,
        waker: Arc<AtomicWaker>,
        _registered: Registered,
    }
}

/// Takes a connection's waker back out when the connection ends.
#[derive(Debug)]
struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared
            .wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl<C: GracefulConnection> Future for Watched<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let mut this = self.project();
        if !*this.asked {
            // Registered before the flag is read, and the stop sets the
            // flag before it wakes: a stop is never missed.
            this.waker.register(cx.waker());
            if this._registered.shared.closing.load(Ordering::SeqCst) {
                this.connection.as_mut().graceful_shutdown();
                *this.asked = true;
            }
        }
        this.connection.poll(cx)
    }
}
