//! A small TCP fault proxy for tests: it sits between clients and a
//! server on loopback and, on command, delays bytes, holds them (a
//! blackhole: a partition that later heals), resets every open connection,
//! closes connections in the middle of a response, or refuses new
//! connections. It speaks no
//! protocol, so it works for Redis, PostgreSQL, AMQP, NATS and HTTP alike.
//!
//! ```no_run
//! # async fn demo() -> Result<(), idem_testkit::ServerError> {
//! use std::time::Duration;
//! let proxy = idem_testkit::doubles::proxy::FaultProxy::start("127.0.0.1:6379".parse().unwrap()).await?;
//! // Point the client at proxy.addr() instead of the server, then:
//! proxy.set_delay(Duration::from_millis(50));
//! proxy.reset_all();
//! proxy.heal();
//! # Ok(()) }
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::servers::failed;
use crate::ServerError;

/// The faults in force. [`Faults::default`] forwards everything untouched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Every chunk waits this long before it is forwarded, each way.
    pub delay: Duration,
    /// Nothing gets through in either direction, not even new connections
    /// to the server: clients see silence and time out, as in a network
    /// partition. Bytes are held, not dropped (TCP would retransmit them),
    /// and flow again in order once the blackhole is lifted.
    pub blackhole: bool,
    /// New connections are accepted and reset at once.
    pub refuse: bool,
    /// A chunk from the server is forwarded only up to this many bytes and
    /// the connection is then reset: a response cut off in the middle.
    pub cut_after: Option<usize>,
}

/// How many connections and faults the proxy has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections reset by [`FaultProxy::reset_all`], refused, or cut.
    pub resets: u64,
    /// Chunks the blackhole held back.
    pub held: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    resets: AtomicU64,
    held: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    faults: Mutex<Faults>,
    reset: watch::Sender<u64>,
    counters: Counters,
}

impl Shared {
    fn faults(&self) -> Faults {
        *lock(&self.faults)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running proxy; dropping it stops accepting and closes every
/// connection it forwards.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self, ServerError> {
        Self::start_on(0, upstream).await
    }

    /// Listens on loopback `port` (a free one for 0) and forwards to
    /// `upstream`: for a server that must advertise the proxy's address
    /// before the proxy starts.
    pub async fn start_on(port: u16, upstream: SocketAddr) -> Result<Self, ServerError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .await
            .map_err(|e| failed(format!("proxy: cannot listen on port {port}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| failed(format!("proxy: {e}")))?;
        let shared = Arc::new(Shared {
            upstream,
            faults: Mutex::new(Faults::default()),
            reset: watch::channel(0).0,
            counters: Counters::default(),
        });
        let task = tokio::spawn(accept(listener, Arc::clone(&shared)));
        Ok(Self { addr, shared, task })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.shared.faults()
    }

    /// Replaces the faults in force (open connections see them at their
    /// next chunk).
    pub fn set(&self, faults: Faults) {
        *lock(&self.shared.faults) = faults;
    }

    /// Adds `delay` to every chunk, each way.
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.shared.faults).delay = delay;
    }

    /// Holds every byte and new connection back, or lets them through
    /// again.
    pub fn set_blackhole(&self, on: bool) {
        lock(&self.shared.faults).blackhole = on;
    }

    /// Resets new connections at once, or stops doing so.
    pub fn set_refuse(&self, on: bool) {
        lock(&self.shared.faults).refuse = on;
    }

    /// Cuts server chunks after `bytes` and resets their connection, or
    /// (`None`) stops doing so.
    pub fn set_cut_after(&self, bytes: Option<usize>) {
        lock(&self.shared.faults).cut_after = bytes;
    }

    /// Removes every fault.
    pub fn heal(&self) {
        self.set(Faults::default());
    }

    /// Resets (RST) every connection open now, both sides.
    pub fn reset_all(&self) {
        self.shared.reset.send_modify(|n| *n += 1);
    }

    /// What the proxy has seen so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            connections: c.connections.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
            held: c.held.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Ends every connection task too.
        self.reset_all();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            if shared.faults().refuse {
                shared.counters.resets.fetch_add(1, Ordering::Relaxed);
                abort(&client);
                return;
            }
            hold(&shared).await;
            let Ok(server) = TcpStream::connect(shared.upstream).await else {
                abort(&client);
                return;
            };
            forward(client, server, &shared).await;
        });
    }
}

/// Why a connection's forwarding ended.
enum End {
    /// One side closed or failed: close the other normally.
    Closed,
    /// A fault ended it: reset both sides.
    Reset,
}

async fn forward(client: TcpStream, server: TcpStream, shared: &Shared) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut reset = shared.reset.subscribe();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let end = tokio::select! {
        end = pump(&mut client_read, &mut server_write, shared, false) => end,
        end = pump(&mut server_read, &mut client_write, shared, true) => end,
        _ = reset.changed() => End::Reset,
    };
    if matches!(end, End::Reset) {
        shared.counters.resets.fetch_add(1, Ordering::Relaxed);
        abort(client_write.as_ref());
        abort(server_write.as_ref());
    }
}

/// Sets SO_LINGER to zero so that dropping the socket sends RST.
fn abort(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Waits while a blackhole is in force.
async fn hold(shared: &Shared) {
    if !shared.faults().blackhole {
        return;
    }
    shared.counters.held.fetch_add(1, Ordering::Relaxed);
    while shared.faults().blackhole {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    shared: &Shared,
    from_server: bool,
) -> End {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        hold(shared).await;
        let faults = shared.faults();
        if !faults.delay.is_zero() {
            tokio::time::sleep(faults.delay).await;
        }
        let cut = faults.cut_after.filter(|_| from_server);
        let take = cut.map_or(n, |c| c.min(n));
        if to.write_all(&buf[..take]).await.is_err() {
            return End::Closed;
        }
        if cut.is_some() {
            return End::Reset;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        let mut filled = 0;
        while filled < got.len() {
            match stream.read(&mut got[filled..]).await? {
                0 => break,
                n => filled += n,
            }
        }
        got.truncate(filled);
        Ok(got)
    }

    #[tokio::test]
    async fn forwards_and_injects_each_fault() {
        let proxy = FaultProxy::start(echo().await).await.expect("proxy");
        let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert_eq!(round_trip(&mut s, b"hello").await.expect("io"), b"hello");

        proxy.set_cut_after(Some(2));
        assert_eq!(round_trip(&mut s, b"hello").await.expect("io"), b"he");
        proxy.heal();

        let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");
        proxy.set_blackhole(true);
        let silent =
            tokio::time::timeout(Duration::from_millis(200), round_trip(&mut s, b"held")).await;
        assert!(silent.is_err(), "a blackhole answers nothing");
        assert!(proxy.stats().held >= 1);
        proxy.heal();
        let mut late = [0u8; 4];
        s.read_exact(&mut late).await.expect("held bytes arrive");
        assert_eq!(
            &late, b"held",
            "held bytes flow again, in order, once healed"
        );

        let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");
        assert_eq!(round_trip(&mut s, b"ok").await.expect("io"), b"ok");
        proxy.reset_all();
        let after = round_trip(&mut s, b"gone").await;
        assert!(
            after.is_err() || matches!(&after, Ok(v) if v.is_empty()),
            "a reset connection carries nothing more: {after:?}"
        );

        proxy.set_refuse(true);
        let mut s = TcpStream::connect(proxy.addr()).await.expect("connect");
        let refused = round_trip(&mut s, b"no").await;
        assert!(refused.is_err() || matches!(&refused, Ok(v) if v.is_empty()));
        assert!(proxy.stats().resets >= 3, "{:?}", proxy.stats());
        assert!(proxy.stats().connections >= 4);
    }
}
