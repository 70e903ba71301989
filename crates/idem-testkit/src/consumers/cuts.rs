//! The connection-cut scenario every broker adapter's tests run: the
//! consumer reaches its broker through a [`FaultProxy`], and every
//! connection through it is reset three times while deliveries are being
//! handled and acknowledged. The consumer must reconnect by itself and go
//! on; every message must have exactly one effect.
//!
//! The adapter's test publishes [`keys`] (payload `{"id": key}`, keyed by
//! the `Idempotency-Key` header), runs its consumer through the proxy with
//! a handler from [`handler`] until [`cut_three_times`] resolves, and
//! hands the result to [`assert_survived`]. The restart variant stops
//! the broker mid-stream and starts it again instead
//! ([`restart_mid_stream`], [`assert_restarted`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_consumer::{Job, Message};

use crate::consumers::ledger::{eventually, order_handler, Handled, Ledger};
use crate::doubles::proxy::FaultProxy;
use crate::ServerError;

/// How many messages the scenario publishes.
pub const MESSAGES: usize = 60;

/// The keys to publish, one message each.
pub fn keys() -> Vec<String> {
    (0..MESSAGES).map(|i| format!("cut-{i}")).collect()
}

/// The payload of the message for `key`.
pub fn payload(key: &str) -> String {
    format!(r#"{{"id":"{key}"}}"#)
}

/// A proxy in front of the broker listening on loopback `port`.
pub async fn proxy(port: u16) -> Arc<FaultProxy> {
    Arc::new(
        FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .expect("fault proxy"),
    )
}

/// The handler: [`order_handler`], 30 ms per message, so that cuts land
/// while deliveries are in hand.
pub fn handler<M: Message>(ledger: Ledger) -> impl Fn(Job<M>) -> Handled + Send + Sync + 'static {
    move |job| {
        let ledger = ledger.clone();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            order_handler(job, ledger, None).await
        })
    }
}

/// The consumer's shutdown: resets every connection through `proxy` once
/// 10, 25 and 40 effects are in (each time once the consumer has
/// connected again), then resolves a few seconds after the last effect,
/// so deliveries the last cut sent back settle.
pub async fn cut_three_times(ledger: Ledger, proxy: Arc<FaultProxy>) {
    for (cut, at) in [10, 25, 40].into_iter().enumerate() {
        eventually(Duration::from_secs(60), || {
            proxy.stats().connections > cut as u64 && ledger.effects().len() >= at
        })
        .await;
        cut_one(&proxy).await;
    }
    eventually(Duration::from_secs(90), || {
        ledger.effects().len() == MESSAGES
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// Resets the connections through `proxy` until one was open to be cut
/// (an HTTP client may hold none between requests), for at most 10 s.
async fn cut_one(proxy: &FaultProxy) {
    let before = proxy.stats().resets;
    for _ in 0..500 {
        proxy.reset_all();
        tokio::time::sleep(Duration::from_millis(20)).await;
        if proxy.stats().resets > before {
            return;
        }
    }
}

/// The consumer's shutdown for the restart variant: once 15 effects are
/// in, notes how many in `at_restart` and runs `restart` on the server
/// (on a blocking thread: restarts wait for processes), then resolves a
/// few seconds after the last effect.
pub async fn restart_mid_stream<T: Send + 'static>(
    ledger: Ledger,
    server: Arc<Mutex<T>>,
    restart: fn(&mut T) -> Result<(), ServerError>,
    at_restart: Arc<AtomicUsize>,
) {
    eventually(Duration::from_secs(60), || ledger.effects().len() >= 15).await;
    at_restart.store(ledger.effects().len(), Ordering::SeqCst);
    tokio::task::spawn_blocking(move || restart(&mut server.lock().expect("server lock")))
        .await
        .expect("restart task")
        .expect("restart the broker");
    eventually(Duration::from_secs(90), || {
        ledger.effects().len() == MESSAGES
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// Judges a restart run: the restart came mid-stream, every message had
/// exactly one effect, none was dead-lettered.
pub fn assert_restarted(ledger: &Ledger, at_restart: usize, dead_letters: u64) {
    assert!(
        at_restart < MESSAGES,
        "the broker went down mid-stream ({at_restart} effects in)"
    );
    assert_exactly_once(ledger, dead_letters);
}

/// Judges a run: three cuts were made and the consumer connected again
/// after each, every message had exactly one effect, none was
/// dead-lettered.
pub fn assert_survived(ledger: &Ledger, proxy: &FaultProxy, dead_letters: u64) {
    let stats = proxy.stats();
    assert!(
        stats.resets >= 3 && stats.connections >= 4,
        "three cuts, and a connection again after each: {stats:?}"
    );
    assert_exactly_once(ledger, dead_letters);
}

fn assert_exactly_once(ledger: &Ledger, dead_letters: u64) {
    let effects = ledger.effects();
    assert_eq!(
        effects.len(),
        MESSAGES,
        "every message had its effect: {effects:?}"
    );
    assert!(
        effects.values().all(|n| *n == 1),
        "and only one: {effects:?}"
    );
    assert_eq!(dead_letters, 0, "nothing was dead-lettered");
}
